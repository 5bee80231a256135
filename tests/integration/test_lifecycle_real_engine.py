"""Timeouts and SIGTERM drain against real server processes (real vLLM, real SmolLM2)."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator

import httpx
import pytest
from loadtest.server_process import ServerProcess

from tests.integration.conftest import MODEL, eventually, running_servers
from tests.integration.test_metrics_real_engine import wait_idle
from tests.streams import StreamReader

LONG = {"model": MODEL, "prompt": "1, 2, 3, 4, 5,", "max_tokens": 1500, "ignore_eos": True, "temperature": 0}


def test_timeout_aborts_the_engine_request_and_answers_504(server: ServerProcess) -> None:
    wait_idle(server)
    started = time.monotonic()
    response = httpx.post(f"{server.base_url}/v1/completions", json={**LONG, "timeout": 1.0}, timeout=30)
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "request_timeout"
    assert time.monotonic() - started < 5
    wait_idle(server, timeout_s=5)


def test_stream_timeout_sends_an_sse_error_then_done(server: ServerProcess) -> None:
    wait_idle(server)
    with httpx.stream(
        "POST", f"{server.base_url}/v1/completions", json={**LONG, "timeout": 1.5, "stream": True}, timeout=30
    ) as response:
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "request_timeout"
    assert len(events) > 3
    wait_idle(server, timeout_s=5)


KEYS = {"rate": "sk-rate-limited", "drain": "sk-drain"}


@pytest.fixture(scope="module")
def drain_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server of its own, with API keys and per-key limits on; the drain test ends its life."""
    limits = ["server.shutdown_timeout_s=15", "auth.requests_per_minute=6", "auth.tokens_per_minute=1600"]
    args = [arg for limit in limits for arg in ("--set", limit)]
    env = {"drain": {"LLMSERVE_AUTH__API_KEYS": json.dumps(list(KEYS.values()))}}
    with running_servers(tmp_path_factory, {"drain": args}, ended_by_tests={"drain"}, env=env) as servers:
        yield servers["drain"]


def test_api_keys_and_per_key_token_and_request_limits(drain_server: ServerProcess) -> None:
    url = f"{drain_server.base_url}/v1/completions"
    headers = {"Authorization": f"Bearer {KEYS['rate']}"}
    capital = {"model": MODEL, "prompt": "The capital of France is", "temperature": 0}
    assert httpx.post(url, json={**capital, "max_tokens": 2}).status_code == 401
    wrong = httpx.post(url, json={**capital, "max_tokens": 2}, headers={"Authorization": "Bearer sk-x"})
    assert wrong.status_code == 401
    assert wrong.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(f"{drain_server.base_url}/health").status_code == 200, "probes need no key"

    # 5 prompt tokens + 1200 reserved of 1600; stopping at once uses ~5, the rest is refunded
    first_counted_at = time.monotonic()
    first = httpx.post(url, json={**capital, "max_tokens": 1200, "stop": [" Paris"]}, headers=headers)
    assert first.status_code == 200
    assert first.headers["x-ratelimit-limit-tokens"] == "1600"
    assert int(first.headers["x-ratelimit-remaining-tokens"]) < 450
    second = httpx.post(url, json={**capital, "max_tokens": 1200, "stop": [" Paris"]}, headers=headers)
    assert second.status_code == 200, "only the refund of the first reservation leaves room for this one"
    too_many_tokens = httpx.post(url, json={**capital, "max_tokens": 2000}, headers=headers)
    assert too_many_tokens.status_code == 429
    assert too_many_tokens.json()["error"]["type"] == "tokens"
    assert int(too_many_tokens.headers["retry-after"]) >= 1

    # 6 requests per minute: a bucket of 6 that refills one request every 10 s, refusals not counted.
    admitted = 2
    while (refused := httpx.post(url, json={**capital, "max_tokens": 1}, headers=headers)).status_code == 200:
        admitted += 1
        assert admitted <= 12, "the request limit never refused"
    refilled = int((time.monotonic() - first_counted_at) / 10)  # 0 unless this machine is very slow
    assert refused.status_code == 429
    assert refused.json()["error"]["type"] == "requests"
    assert 6 <= admitted <= 6 + refilled
    metrics = drain_server.scrape()
    assert metrics.value("llmserve_rejections_total", reason="rate_limited") == 2


def test_sigterm_drains_in_flight_streams_refuses_new_work_and_exits_0(drain_server: ServerProcess) -> None:
    url = f"{drain_server.base_url}/v1/completions"
    drain_key = {"Authorization": f"Bearer {KEYS['drain']}"}
    short = StreamReader(url, {**LONG, "max_tokens": 12}, drain_key)
    long = StreamReader(url, LONG, drain_key)  # outlives the 15 s deadline
    for reader in (short, long):
        reader.start()
        assert reader.started.wait(60)
    drain_server.process.send_signal(signal.SIGTERM)
    ready = f"{drain_server.base_url}/ready"
    assert eventually(lambda: httpx.get(ready).status_code == 503, timeout_s=5), "out of the load balancer"
    refused = httpx.post(
        url, json={**LONG, "max_tokens": 2}, headers={"Authorization": f"Bearer {KEYS['drain']}"}, timeout=10
    )
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "draining"
    short.join(60)
    long.join(60)
    assert short.events[-1] == "[DONE]"
    assert json.loads(short.events[-2])["choices"][0]["finish_reason"] == "length", "in-flight work finished"
    assert long.events[-1] == "[DONE]"
    assert json.loads(long.events[-2])["error"]["code"] == "draining", (
        "cut at the drain deadline, with an error"
    )
    assert drain_server.process.wait(timeout=60) == 0
