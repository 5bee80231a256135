"""Bodies over server.max_request_body_bytes get 413 with an OpenAI error, declared or streamed."""

from __future__ import annotations

import json
from collections.abc import Iterator

from loadtest.prom import Scrape

from llmserve.config import parse_overrides
from tests.unit.conftest import MODEL, make_client

LIMIT = 2048


def oversized_body() -> bytes:
    return json.dumps({"model": MODEL, "prompt": "word " * LIMIT}).encode()


def test_declared_oversized_body_is_413_and_counted_as_too_large() -> None:
    with make_client(parse_overrides([f"server.max_request_body_bytes={LIMIT}"])) as client:
        response = client.post(
            "/v1/completions", content=oversized_body(), headers={"content-type": "application/json"}
        )
        assert response.status_code == 413
        assert response.json()["error"]["code"] == "request_too_large"
        scrape = Scrape.parse(client.get("/metrics").text)
        assert scrape.value("llmserve_rejections_total", reason="too_large") == 1
        assert scrape.value("llmserve_requests_total", status="413") == 1


def test_streamed_oversized_body_without_length_is_413() -> None:
    def chunks() -> Iterator[bytes]:
        body = oversized_body()
        for start in range(0, len(body), 512):
            yield body[start : start + 512]

    with make_client(parse_overrides([f"server.max_request_body_bytes={LIMIT}"])) as client:
        response = client.post(
            "/v1/completions", content=chunks(), headers={"content-type": "application/json"}
        )
        assert response.status_code == 413
        assert response.json()["error"]["code"] == "request_too_large"
        assert (
            Scrape.parse(client.get("/metrics").text).value("llmserve_rejections_total", reason="too_large")
            == 1
        )


def test_bodies_within_the_limit_are_served() -> None:
    with make_client(parse_overrides([f"server.max_request_body_bytes={LIMIT}"])) as client:
        response = client.post("/v1/completions", json={"model": MODEL, "prompt": "a b", "max_tokens": 1})
        assert response.status_code == 200
