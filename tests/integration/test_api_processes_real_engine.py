"""server.api_processes = 2: two API processes on one socket over one real vLLM engine core.

The engine core runs vLLM's simulated-GPU executor (engine.simulated_gpu: real scheduler, KV cache
and detokenizer, timed stand-in forward pass) so that requests are fast and long generations take
seconds by the clock. What a user relies on: both processes serve; /metrics from either is the
group's (no request counted twice or lost); admission's in-flight limit and a key's rate limit
hold for the group, not per process; SIGTERM drains the group (the fixture checks exit code 0,
no process left behind and no traceback); one dead process or a dead engine core stops the group
with a non-zero exit.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time
from collections.abc import Iterator

import httpx
import psutil
import pytest
from loadtest.server_process import ServerProcess, still_running

from tests.integration.conftest import READY_TIMEOUT_S, running_servers, session_dtype, users_in_module

MODEL = "SmolLM2-135M-Instruct-simulated-H200"
KEYS = ("sk-metrics", "sk-admission", "sk-rate-limited")
REQUESTS_PER_MINUTE = 12
MAX_IN_FLIGHT = 3
GROUP_ARGS = ("--config", "configs/sim-h200-smollm2.yaml", "--set", "server.api_processes=2")


@pytest.fixture(scope="module")
def groups(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, ServerProcess]]:
    """The module's groups, started together: one shared by the tests (keys and limits on) and
    one for each test that kills a process of its own."""
    keys = "[" + ",".join(f'"{key}"' for key in KEYS) + "]"
    plain = (*GROUP_ARGS, "--set", f"engine.dtype={session_dtype()}")
    shared = (*plain, "--set", f"auth.api_keys={keys}",
              "--set", f"auth.requests_per_minute={REQUESTS_PER_MINUTE}",
              "--set", f"admission.max_in_flight={MAX_IN_FLIGHT}")  # fmt: skip
    doomed = [f"doomed-group-{index}" for index in range(users_in_module(request, "doomed_group"))]
    with running_servers(
        tmp_path_factory, {"api-processes": shared, **dict.fromkeys(doomed, plain)}, ended_by_tests=doomed
    ) as started:
        # /ready answers from whichever process accepts first; the other may still be connecting
        # to the engine core (it takes no connection until it listens).
        deadline = time.monotonic() + READY_TIMEOUT_S
        for process in started.values():
            while process.log().count("llmserve ready on") < 2:
                assert time.monotonic() < deadline, "the second API process never became ready"
                time.sleep(0.2)
        yield started


@pytest.fixture(scope="module")
def group(groups: dict[str, ServerProcess]) -> ServerProcess:
    return groups["api-processes"]


@pytest.fixture
def doomed_group(groups: dict[str, ServerProcess]) -> ServerProcess:
    """A group of its own that the test kills a process of (the module stops what is left)."""
    return groups.pop(next(name for name in groups if name.startswith("doomed-group")))


def complete(server: ServerProcess, key: str, max_tokens: int = 4) -> httpx.Response:
    # A new connection per request, so the kernel spreads them over both processes.
    return httpx.post(
        f"{server.base_url}/v1/completions",
        json={"model": MODEL, "prompt": "Hello", "max_tokens": max_tokens, "ignore_eos": True},
        headers={"Authorization": f"Bearer {key}"},
        timeout=120,
    )


def test_both_processes_serve_and_metrics_count_each_request_once(group: ServerProcess) -> None:
    before = group.scrape()
    requests = 10  # within the key's rate limit
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        statuses = [r.status_code for r in pool.map(lambda _: complete(group, KEYS[0]), range(requests))]
    assert statuses == [200] * requests
    log = group.log()
    assert "[api-0]" in log
    assert "[api-1]" in log
    assert log.count("llmserve ready on") == 2
    after = group.scrape()
    route = {"route": "/v1/completions", "status": "200"}
    assert (
        after.value("llmserve_requests_total", **route) - before.value("llmserve_requests_total", **route)
        == requests
    )
    assert (
        after.value("llmserve_generation_tokens_total") - before.value("llmserve_generation_tokens_total")
        == 4 * requests
    )
    # vLLM's own counter, summed over both front ends' files: each request once.
    succeeded = after.value("vllm:request_success_total") - before.value("vllm:request_success_total")
    assert succeeded == requests
    # Each process publishes its gauges every second and at the scrapes it answers: the other
    # process's reading may be up to a second old (docs/observability.md).
    assert settles_to_zero(group, "llmserve_requests_in_flight")
    # Both processes accept on one listening socket: its backlog (uvicorn's 2048, or the
    # kernel's somaxconn if lower) is read once, not summed over the processes.
    assert 0 < group.metric("llmserve_accept_queue_limit") <= 2048


def settles_to_zero(server: ServerProcess, gauge: str, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while server.metric(gauge) != 0:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_the_in_flight_limit_holds_for_the_group(group: ServerProcess) -> None:
    """12 long generations at once over both processes: the engine never runs more than
    admission.max_in_flight of them, and every one is served (queued, not refused)."""
    running_seen: list[float] = []
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        futures = [pool.submit(complete, group, KEYS[1], 1200) for _ in range(12)]
        while not all(f.done() for f in futures):
            running_seen.append(group.metric("vllm:num_requests_running"))
            time.sleep(0.1)
        statuses = [f.result().status_code for f in futures]
    assert statuses == [200] * 12
    assert max(running_seen) <= MAX_IN_FLIGHT
    assert MAX_IN_FLIGHT in running_seen


def test_a_keys_rate_limit_holds_for_the_group(group: ServerProcess) -> None:
    statuses = [complete(group, KEYS[2]).status_code for _ in range(REQUESTS_PER_MINUTE + 6)]
    assert statuses.count(200) == REQUESTS_PER_MINUTE
    assert statuses.count(429) == 6


@pytest.mark.parametrize("victim", ["an API process", "the engine core"])
def test_a_dead_process_stops_the_group_with_a_non_zero_exit(
    doomed_group: ServerProcess, victim: str
) -> None:
    children = doomed_group.processes()[1:]
    engine = [p for p in children if p.name().startswith("VLLM::EngineCor")]
    serving = [p for p in children if p not in engine and _listens_on(p, doomed_group.port)]
    assert len(engine) == 1, [p.name() for p in children]
    assert len(serving) == 2, [p.name() for p in children]
    target = serving[0] if victim == "an API process" else engine[0]
    os.kill(target.pid, signal.SIGKILL)
    code = doomed_group.process.wait(timeout=60)
    assert code == 1, doomed_group.log()[-3000:]
    assert "stopping the group" in doomed_group.log()
    assert still_running(children, timeout_s=10) == [], "every process of the group ends with it"


def _listens_on(process: psutil.Process, port: int) -> bool:
    try:
        return any(
            c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
            for c in process.net_connections()
        )
    except psutil.Error:
        return False
