"""The model's generation_config.json supplies the sampling defaults, as vLLM's `--generation-config
auto` does (Llama-3-Instruct ships temperature 0.6 and top_p 0.9): a server on a copy of SmolLM2
whose generation config makes sampling greedy (top_k 1) and short (max_new_tokens 6)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from loadtest.server_process import REPO, ServerProcess

from tests.integration.conftest import MODEL, running_server

MODEL_DIR = REPO / ".cache/models/SmolLM2-135M-Instruct"
GENERATION_DEFAULTS = {"do_sample": True, "temperature": 0.7, "top_k": 1, "max_new_tokens": 6}
CHAT = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def defaults_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    model = tmp_path_factory.mktemp("model-with-defaults")
    for source in MODEL_DIR.iterdir():
        if source.name not in ("generation_config.json", "llmserve-manifest.json"):
            (model / source.name).symlink_to(source)
    config = json.loads((MODEL_DIR / "generation_config.json").read_text())
    (model / "generation_config.json").write_text(json.dumps({**config, **GENERATION_DEFAULTS}))
    args = ("--model", str(model), "--set", "engine.dtype=float32", "--set", "engine.kv_cache_memory_gib=0.5")
    with running_server(tmp_path_factory, "generation-config", *args) as process:
        yield process


def chat(server: ServerProcess, **fields: object) -> dict:  # type: ignore[type-arg]
    body = {"model": MODEL, "messages": CHAT, **fields}
    response = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    answer: dict = response.json()  # type: ignore[type-arg]
    return answer


def test_omitted_fields_take_the_models_defaults(defaults_server: ServerProcess) -> None:
    omitted = chat(defaults_server)
    assert omitted["usage"]["completion_tokens"] <= 6, "max_new_tokens bounds the default length"
    greedy = chat(defaults_server, temperature=0, max_tokens=6)
    assert omitted["choices"][0]["message"]["content"] == greedy["choices"][0]["message"]["content"], (
        "top_k 1 from the generation config makes the default sampling greedy"
    )
    assert (
        "sampling defaults for fields a request omits: {'temperature': 0.7, 'top_k': 1, 'max_tokens': 6}"
        in (defaults_server.log())
    )


def test_fields_a_request_gives_win_over_the_models_defaults(defaults_server: ServerProcess) -> None:
    sampled = chat(defaults_server, temperature=1.0, top_k=0, n=4, seed=7, max_tokens=12, ignore_eos=True)
    texts = [choice["message"]["content"] for choice in sampled["choices"]]
    assert sampled["usage"]["completion_tokens"] == 4 * 12
    assert len(set(texts)) > 1, "with top_k 0 given, four samples at temperature 1 differ"
