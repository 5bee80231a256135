"""API keys: Bearer tokens checked against SHA-256 digests; probes stay open."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from llmserve.cli import main
from llmserve.config import parse_overrides
from tests.unit.conftest import MODEL, make_client

BODY = {"model": MODEL, "prompt": "a", "max_tokens": 1}


def keys_env(monkeypatch: pytest.MonkeyPatch, *keys: str) -> None:
    monkeypatch.setenv("LLMSERVE_AUTH__API_KEYS", json.dumps(list(keys)))


def test_without_keys_configured_no_key_is_needed() -> None:
    with make_client() as client:
        assert client.post("/v1/completions", json=BODY).status_code == 200


def test_missing_or_wrong_key_is_401_with_an_openai_error(monkeypatch: pytest.MonkeyPatch) -> None:
    keys_env(monkeypatch, "sk-right")
    with make_client() as client:
        for headers in ({}, {"Authorization": "Bearer sk-wrong"}, {"Authorization": "Basic sk-right"}):
            response = client.post("/v1/completions", json=BODY, headers=headers)
            assert response.status_code == 401
            assert response.headers["www-authenticate"] == "Bearer"
            assert response.json()["error"]["code"] == "invalid_api_key"
            assert "sk-right" not in response.text


def test_right_key_is_served_on_every_api_route(monkeypatch: pytest.MonkeyPatch) -> None:
    keys_env(monkeypatch, "sk-one", "sk-two")
    with make_client() as client:
        headers = {"Authorization": "Bearer sk-two"}
        assert client.post("/v1/completions", json=BODY, headers=headers).status_code == 200
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        assert client.post("/v1/chat/completions", json=chat, headers=headers).status_code == 200
        assert client.get("/v1/models", headers=headers).status_code == 200
        assert client.get("/v1/models").status_code == 401


def test_probes_stay_open_and_metrics_are_protected_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    keys_env(monkeypatch, "sk-1")
    with make_client() as client:
        assert client.get("/health").status_code == 200
        assert client.get("/ready").status_code == 200
        assert client.get("/metrics").status_code == 200
    with make_client(parse_overrides(["auth.protect_metrics=true"])) as client:
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers={"Authorization": "Bearer sk-1"}).status_code == 200


def test_key_file_holds_keys_or_their_digests(tmp_path: Path) -> None:
    key_file = tmp_path / "keys"
    digest = hashlib.sha256(b"sk-hashed").hexdigest()
    key_file.write_text(f"# team keys\nsk-plain\nsha256:{digest}  # ops\n\n")
    with make_client(parse_overrides([f"auth.api_keys_file={key_file}"])) as client:
        for key in ("sk-plain", "sk-hashed"):
            response = client.post("/v1/completions", json=BODY, headers={"Authorization": f"Bearer {key}"})
            assert response.status_code == 200
        bad = client.post("/v1/completions", json=BODY, headers={"Authorization": f"Bearer {digest}"})
        assert bad.status_code == 401, "a digest is not itself a key"


def test_unreadable_or_malformed_key_file_stops_start_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "keys"
    bad.write_text("sha256:nothex\n")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    args = ["serve", "--model", str(model), "--set"]
    assert main([*args, f"auth.api_keys_file={bad}"]) == 2
    assert "not a SHA-256 hex digest" in capsys.readouterr().err
    assert main([*args, f"auth.api_keys_file={tmp_path / 'absent'}"]) == 2
    assert "cannot read" in capsys.readouterr().err
