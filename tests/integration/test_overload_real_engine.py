"""Overload and engine death against a dedicated real server with small admission limits."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import statistics
import time
from collections.abc import Iterator

import httpx
import psutil
import pytest
from loadtest.prom import bucket_deltas, histogram_quantile
from loadtest.server_process import ServerProcess, still_running

from tests.integration.conftest import MODEL, running_servers
from tests.integration.robustness import LEDGER

QUEUE_TIMEOUT_S = 9  # the queue-wait histogram has an edge at 10 s
LIMITS = [
    "admission.max_in_flight=4",
    "admission.max_waiting=4",
    f"admission.queue_timeout_s={QUEUE_TIMEOUT_S}",
]


@pytest.fixture(scope="module")
def limited_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server of its own, with room for 4 running and 4 waiting requests; the last test kills its engine."""
    args = [arg for limit in LIMITS for arg in ("--set", limit)]
    with running_servers(tmp_path_factory, {"limited": args}, ended_by_tests={"limited"}) as servers:
        yield servers["limited"]


def test_overload_gets_fast_429s_while_admitted_requests_succeed_within_the_deadline(
    limited_server: ServerProcess,
) -> None:
    base = limited_server.base_url
    rss_before = limited_server.rss_mb()
    before = limited_server.scrape()

    async def one(client: httpx.AsyncClient, index: int) -> tuple[httpx.Response, float]:
        started = time.perf_counter()
        body = {"model": MODEL, "prompt": f"Count: {index},", "max_tokens": 16, "ignore_eos": True}
        response = await client.post("/v1/completions", json=body)
        return response, time.perf_counter() - started

    async def burst() -> list[tuple[httpx.Response, float]]:
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits) as client:
            return await asyncio.gather(*(one(client, i) for i in range(40)))

    results = asyncio.run(burst())
    for response, _ in results:
        LEDGER.record("burst of 5x capacity (4 running + 4 waiting places)", response.status_code)
    LEDGER.observe_rss(limited_server.rss_mb())
    admitted = [(r, t) for r, t in results if r.status_code == 200]
    refused = [(r, t) for r, t in results if r.status_code == 429]
    assert len(admitted) + len(refused) == 40, [r.status_code for r, _ in results]
    assert len(admitted) >= 8, "the 4 running and 4 waiting places were used"
    assert refused, "several times the capacity must be refused"
    for response, _ in refused:
        assert response.json()["error"]["code"] == "overloaded"
        assert int(response.headers["retry-after"]) >= 1
    for response, _ in refused:
        assert "waited" not in response.json()["error"]["message"], "refused on arrival, not at the deadline"
    refusal_s = [t for _, t in refused]
    # Client-side times include connecting and a 2-core host shared with the engine, so they are
    # compared within this run rather than with a fixed bound: a refusal costs less than generating.
    assert statistics.median(refusal_s) < statistics.median(t for _, t in admitted)
    LEDGER.notes.append(
        f"burst: {len(refused)} refused (p50 {statistics.median(refusal_s) * 1000:.0f} ms, "
        f"max {max(refusal_s) * 1000:.0f} ms client-side), {len(admitted)} admitted"
    )
    after = limited_server.scrape()
    server_side = histogram_quantile(0.99, bucket_deltas(after, before, "llmserve_rejection_latency_seconds"))
    assert server_side is not None
    LEDGER.notes.append(f"burst: refusal p99 measured in the server {server_side * 1000:.1f} ms")
    assert server_side < 1.0, "a refusal is decided before any engine work"
    waits = bucket_deltas(after, before, "llmserve_queue_wait_seconds")
    within = dict(waits)[float(QUEUE_TIMEOUT_S + 1)]
    assert within == dict(waits)[float("inf")] == len(admitted), (
        "no admitted request waited past its deadline"
    )
    ratio = "llmserve_admission_e2e_prediction_ratio"
    predictions = bucket_deltas(after, before, ratio)
    assert dict(predictions)[float("inf")] == len(admitted), "each admitted request's prediction was checked"
    median = histogram_quantile(0.5, predictions)
    assert median is not None
    LEDGER.notes.append(f"burst: admitted requests took {median:.2f}x admission's prediction at the median")
    assert 0.25 <= median <= 4, "the predictions admission decides on are of the right order"
    assert httpx.get(f"{base}/health").status_code == 200
    assert (
        httpx.post(
            f"{base}/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2}
        ).status_code
        == 200
    )
    assert limited_server.rss_mb() - rss_before < 500, "memory stays bounded"


def test_before_it_reports_ready_it_has_measured_what_a_prompt_adds_to_a_step(
    limited_server: ServerProcess,
) -> None:
    """Calibration sends prompts into a running batch, so that a fresh server's first burst is
    predicted with what its prompts cost the steps that take them in, not as if they were free."""
    line = next(line for line in limited_server.log().splitlines() if "admission's service model" in line)
    per_prompt_token = re.search(r"\+ (\d+) µs per prompt token it takes in", line)
    assert per_prompt_token is not None, line
    assert int(per_prompt_token.group(1)) > 0, line


def test_killed_engine_fails_in_flight_work_turns_health_503_and_exits_nonzero(
    limited_server: ServerProcess,
) -> None:
    events: list[str] = []
    processes = limited_server.processes()
    body = {"model": MODEL, "prompt": "1, 2, 3,", "max_tokens": 1500, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{limited_server.base_url}/v1/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        events.append(next(line for line in lines if line))
        engine_core = next(
            p
            for p in psutil.Process(limited_server.process.pid).children(recursive=True)
            if "EngineCore" in " ".join(p.cmdline()) or "EngineCore" in p.name()
        )
        engine_core.send_signal(signal.SIGKILL)
        events.extend(line for line in lines if line)
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2].removeprefix("data: "))["error"]["code"] == "engine_dead"
    code = limited_server.process.wait(timeout=60)
    assert code != 0, "a supervisor must see the failure and restart the server"
    assert still_running(processes, timeout_s=10) == [], "the engine's workers end with it"
    LEDGER.cases["engine process SIGKILLed mid-stream"] += 1
    LEDGER.notes.append(f"engine killed mid-stream: SSE engine_dead + [DONE], server exit code {code}")
