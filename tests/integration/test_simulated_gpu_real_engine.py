"""The simulated GPU (engine.simulated_gpu) replaces vLLM's forward pass and nothing else.

The same requests, one at a time, go to the session's real server (real vLLM, real SmolLM2) and to
a server with the same engine settings on the simulated executor. Token counts, scheduling (engine
steps and tokens per step) and KV-cache accounting (prefix-cache queries and hits, preemptions)
must come out the same; only the token values differ, and the simulated server says what it is.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from loadtest.server_process import ServerProcess

from tests.integration.conftest import MODEL, eventually, running_servers, session_dtype

# vLLM's own counters of what its scheduler and KV cache manager did.
ENGINE_COUNTERS = (
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:iteration_tokens_total_count",  # engine steps that ran the model
    "vllm:iteration_tokens_total_sum",  # tokens those steps computed
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:num_preemptions_total",
    "vllm:request_success_total",
)


@pytest.fixture(scope="module")
def simulated_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ServerProcess]]:
    simulated = ("--config", "configs/cpu-smollm2.yaml", "--set", f"engine.dtype={session_dtype()}",
                 "--set", "engine.simulated_gpu.gpu=H200")  # fmt: skip
    servers = {
        "simulated-h200": simulated,
        "simulated-h200-stream-interval": (*simulated, "--set", "engine.stream_interval=4"),
    }
    with running_servers(tmp_path_factory, servers) as started:
        yield started


@pytest.fixture(scope="module")
def simulated_server(simulated_servers: dict[str, ServerProcess]) -> ServerProcess:
    return simulated_servers["simulated-h200"]


@pytest.fixture(scope="module")
def coarse_stream_server(simulated_servers: dict[str, ServerProcess]) -> ServerProcess:
    return simulated_servers["simulated-h200-stream-interval"]


def workload() -> list[tuple[str, dict[str, Any]]]:
    """Sequential requests: a shared ~300-token prefix twice (the second hits the prefix cache),
    a chat, a stream, and a sampled one; every one runs to max_tokens. (Not n > 1: its choices
    reach the engine as separate requests, and whether they share a step is a race.)"""
    prefix = f"Case {uuid.uuid4().hex}. " + " ".join(
        f"Clause {i} of the agreement applies." for i in range(40)
    )
    common = {"model": MODEL, "temperature": 0, "ignore_eos": True}
    return [
        ("completions", {**common, "prompt": prefix + " Question one:", "max_tokens": 12}),
        ("completions", {**common, "prompt": prefix + " Question two:", "max_tokens": 9}),
        ("chat/completions", {**common, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5}),
        (
            "completions",
            {
                **common,
                "prompt": "Once upon a time",
                "max_tokens": 7,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        ),
        ("completions", {**common, "prompt": "A colour:", "max_tokens": 4, "temperature": 0.8, "seed": 7}),
    ]


def run(
    server: ServerProcess, requests: list[tuple[str, dict[str, Any]]]
) -> tuple[list[Any], dict[str, float]]:
    """Each request's usage (or streamed chunk count) and the engine counters' increase."""
    before = {name: server.metric(name) for name in ENGINE_COUNTERS}
    usages: list[Any] = []
    for route, body in requests:
        url = f"{server.base_url}/v1/{route}"
        if body.get("stream"):
            with httpx.stream("POST", url, json=body, timeout=120) as response:
                assert response.status_code == 200
                events = [line for line in response.iter_lines() if line.startswith("data: {")]
            # How many events carry the tokens is a race (vLLM merges deltas the reader has not
            # taken yet, and simulated steps are fast): the usage the stream ends with is not.
            usages.append(("stream usage", json.loads(events[-1].removeprefix("data: "))["usage"]))
        else:
            response = httpx.post(url, json=body, timeout=120)
            assert response.status_code == 200, response.text
            answer = response.json()
            usages.append((answer["usage"], [choice["finish_reason"] for choice in answer["choices"]]))
    generated = sum(body["max_tokens"] for _, body in requests)
    # vLLM's counters follow its steps asynchronously: wait until every generated token is counted.
    eventually(
        lambda: server.metric("vllm:generation_tokens_total") - before[ENGINE_COUNTERS[1]] >= generated, 30
    )
    return usages, {name: server.metric(name) - before[name] for name in ENGINE_COUNTERS}


def test_the_simulation_schedules_caches_and_counts_tokens_as_the_real_engine(
    server: ServerProcess, simulated_server: ServerProcess
) -> None:
    requests = workload()
    real_usage, real_counters = run(server, requests)
    simulated_usage, simulated_counters = run(simulated_server, requests)
    assert simulated_usage == real_usage
    assert simulated_counters == real_counters
    assert real_counters["vllm:prefix_cache_hits_total"] >= 256, "the second request reused the prefix"


def test_the_simulated_server_says_it_is_a_simulation_and_its_text_is_not_the_models(
    server: ServerProcess, simulated_server: ServerProcess
) -> None:
    body = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 8, "ignore_eos": True}
    real = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60).json()
    simulated = httpx.post(f"{simulated_server.base_url}/v1/completions", json=body, timeout=60).json()
    assert simulated["usage"] == real["usage"]
    assert simulated["choices"][0]["text"] != real["choices"][0]["text"]
    assert "SIMULATED GPU (NVIDIA H200 SXM)" in simulated_server.log()
    assert "SIMULATED GPU" not in server.log()


def test_with_a_stream_interval_a_stream_gets_its_tokens_in_fewer_larger_deltas(
    coarse_stream_server: ServerProcess,
) -> None:
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 17, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    with httpx.stream(
        "POST", f"{coarse_stream_server.base_url}/v1/completions", json=body, timeout=120
    ) as response:
        assert response.status_code == 200
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert chunks[-1]["usage"]["completion_tokens"] == 17, "every token still arrives"
    with_text = [chunk for chunk in chunks if chunk["choices"] and chunk["choices"][0]["text"]]
    # The first token at once, then at most one delta per 4 tokens (fewer when vLLM merges more).
    assert 1 <= len(with_text) <= 5
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
