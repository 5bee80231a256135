"""Stopping the server, as supervisors and terminals do it: every process the server started is gone
within `shutdown_timeout_s` + 10 s whichever process gets the signal, busy or idle, and the log is
clean. (SIGTERM to the server alone, idle, ends every other server of the suite: see conftest's
`running_server`; busy, the drain test in test_lifecycle_real_engine.py.)"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator

import pytest
from loadtest.server_process import ServerProcess, still_running

from tests.integration.conftest import MODEL, eventually, running_servers, users_in_module
from tests.streams import StreamReader

SHUTDOWN_TIMEOUT_S = 6
LONG = {"model": MODEL, "prompt": "1, 2, 3,", "max_tokens": 1500, "ignore_eos": True, "temperature": 0}


@pytest.fixture(scope="module")
def fresh_servers(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[ServerProcess]]:
    """A server for each test of this module that ends one, all started together."""
    args = ("--set", f"server.shutdown_timeout_s={SHUTDOWN_TIMEOUT_S}",
            "--set", "engine.kv_cache_memory_gib=0.5")  # fmt: skip
    names = [f"fresh-{index}" for index in range(users_in_module(request, "fresh_server"))]
    with running_servers(tmp_path_factory, dict.fromkeys(names, args), ended_by_tests=names) as started:
        yield list(started.values())


@pytest.fixture
def fresh_server(fresh_servers: list[ServerProcess]) -> ServerProcess:
    """A server this test ends itself (the module stops what a failed test left running)."""
    return fresh_servers.pop()


def test_sigterm_to_the_whole_process_group_while_busy_drains_and_leaves_nothing(
    fresh_server: ServerProcess,
) -> None:
    """What Ctrl-C in a terminal and systemd's control-group stop do: every process gets the signal.
    vLLM's engine processes live in a process group of their own, so the server drains as if it
    alone had been signalled, then stops the engine itself."""
    url = f"{fresh_server.base_url}/v1/completions"
    short, long = StreamReader(url, {**LONG, "max_tokens": 8}), StreamReader(url, LONG)
    for stream in (short, long):
        stream.start()
        assert stream.started.wait(60)
    processes = fresh_server.processes()
    assert len(processes) >= 3, "the server, vLLM's engine core and its worker"
    signalled_at = time.monotonic()
    os.killpg(fresh_server.process.pid, signal.SIGTERM)
    short.join(60)
    long.join(60)
    assert fresh_server.process.wait(timeout=SHUTDOWN_TIMEOUT_S + 30) == 0
    assert (
        still_running(processes, timeout_s=SHUTDOWN_TIMEOUT_S + 10 - (time.monotonic() - signalled_at)) == []
    )
    print(f"\ngroup SIGTERM while busy: every process gone after {time.monotonic() - signalled_at:.1f} s")
    assert json.loads(short.events[-2])["choices"][0]["finish_reason"] == "length", "in-flight work finished"
    assert json.loads(long.events[-2])["error"]["code"] == "draining"
    assert long.events[-1] == "[DONE]"
    assert fresh_server.log_problems() == []


def test_the_engine_processes_end_with_a_killed_server(fresh_server: ServerProcess) -> None:
    """SIGKILL (the OOM killer, `kill -9`) gives the server no chance to stop its engine: the kernel
    ends the engine core (parent-death signal), and its workers follow."""
    processes = fresh_server.processes()
    fresh_server.process.send_signal(signal.SIGKILL)
    fresh_server.process.wait(timeout=10)
    left = eventually(lambda: not still_running(processes[1:], timeout_s=0), timeout_s=10)
    assert left, f"left running: {still_running(processes[1:], timeout_s=0)}"
