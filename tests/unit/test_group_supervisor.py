"""The supervisor of a group of API processes (server.api_processes > 1), with stand-in processes:
when the engine core dies, the group exits non-zero within a bounded time, even if an API process
does not stop when asked (one still starting, waiting on the dead engine core)."""

from __future__ import annotations

import multiprocessing
import signal
import time
from pathlib import Path

import pytest

from llmserve import server_group
from llmserve.server_group import Supervisor


def deaf_api_process() -> None:
    """An API process that does not stop on SIGTERM, as one stuck in its start-up did."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(600)


def dead_engine_core() -> None:
    raise SystemExit(9)


def test_when_the_engine_core_dies_an_api_process_that_will_not_stop_is_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))  # the group's metrics files
    context = multiprocessing.get_context("spawn")
    api = context.Process(target=deaf_api_process, daemon=True)
    engine = context.Process(target=dead_engine_core, daemon=True)
    api.start()
    engine.start()
    time.sleep(1.0)  # the API process has set its SIGTERM handler
    started = time.monotonic()
    code = Supervisor().watch([api], [engine], stop_within_s=300)
    took = time.monotonic() - started
    assert code == 1
    assert api.exitcode == -signal.SIGKILL
    assert took < server_group.ENGINE_GONE_GRACE_S + 5, "not after the drain deadline: nothing can drain"
