"""The supervisor of a group of API processes (server.api_processes > 1), with stand-in processes:
when the engine core dies, the group exits non-zero within a bounded time, even if an API process
does not stop when asked (one still starting, waiting on the dead engine core)."""

from __future__ import annotations

import multiprocessing
import signal
import time
from multiprocessing.synchronize import Event
from pathlib import Path

import pytest

from llmserve import server_group
from llmserve.server_group import Supervisor


def deaf_api_process(deaf: Event) -> None:
    """An API process that does not stop on SIGTERM, as one stuck in its start-up did."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    deaf.set()
    time.sleep(600)


def dead_engine_core() -> None:
    raise SystemExit(9)


def test_when_the_engine_core_dies_an_api_process_that_will_not_stop_is_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))  # the group's metrics files
    context = multiprocessing.get_context("spawn")
    deaf = context.Event()
    api = context.Process(target=deaf_api_process, args=(deaf,), daemon=True)
    engine = context.Process(target=dead_engine_core, daemon=True)
    api.start()
    engine.start()
    # A spawned process imports this module first: on a busy host that took over a second.
    assert deaf.wait(timeout=60), "the API process never ignored SIGTERM"
    started = time.monotonic()
    code = Supervisor().watch([api], [engine], stop_within_s=300)
    took = time.monotonic() - started
    assert code == 1
    assert api.exitcode == -signal.SIGKILL
    assert took < server_group.ENGINE_GONE_GRACE_S + 5, "not after the drain deadline: nothing can drain"
