"""`server.api_processes` > 1: a supervisor, one vLLM engine core, N API processes on one socket.

The supervisor binds the listening socket, creates what the group shares (the engine load and the
keys' rate-limit buckets, policy/shared_state.py; the Prometheus multiprocess directory), then
starts the engine core and the API processes through vLLM's machinery (engine/vllm_group.py).
Each API process is the same app as a single server: it drains on SIGTERM, reports readiness,
runs the engine watchdog and exits non-zero when the engine dies.

The supervisor forwards SIGTERM/SIGINT to every API process (each drains its own requests), waits
for them, then stops the engine core and exits 0. When an API process exits unexpectedly or the
engine core dies, it drains the others and exits 1, so a supervisor above it (Docker, systemd,
Kubernetes) restarts the whole group.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Iterator
from multiprocessing import connection
from multiprocessing.process import BaseProcess
from types import FrameType
from typing import Any

from llmserve.api.auth import KeyRing
from llmserve.config import Config
from llmserve.logs import configure_logging
from llmserve.policy.shared_state import SharedState

logger = logging.getLogger(__name__)

WATCH_INTERVAL_S = 1.0
API_PROCESS_PREFIX = "llmserve-api-"
PR_SET_NAME = 15
# After the API processes' own drain deadline, how long the supervisor waits before killing.
EXIT_GRACE_S = 15.0
# Once the engine core is dead nothing in flight can finish: how long the API processes get to exit.
ENGINE_GONE_GRACE_S = 5.0


def serve_group(config: Config) -> int:
    count = config.server.api_processes
    keys = KeyRing.from_config(config.auth)
    shared = SharedState.create(keys.key_ids() if keys is not None else [])
    metrics_dir = tempfile.mkdtemp(prefix="llmserve-metrics-")
    # Read by prometheus_client when each spawned process imports it.
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    try:
        listening = bind(config.server.host, config.server.port)
    except OSError as exc:
        logger.error("cannot listen on %s:%d: %s", config.server.host, config.server.port, exc.strerror)
        shutil.rmtree(metrics_dir, ignore_errors=True)
        return 1
    supervisor = Supervisor()
    logger.info(
        "llmserve starting %d API processes on http://%s:%d over one engine core; loading model %s",
        count,
        config.server.host,
        config.server.port,
        config.engine.model,
    )
    from llmserve.engine.vllm_group import launch_api_group

    stop_within_s = config.server.shutdown_timeout_s + EXIT_GRACE_S
    try:
        with (
            supervisor.signals(),
            launch_api_group(
                config.engine,
                config.server.served_model_name,
                count,
                f"http://{config.server.host}:{config.server.port}",
                listening,
                run_api_process,
                (config, shared),
                stop_within_s,
            ) as group,
        ):
            return supervisor.watch(group.api_processes, group.engine_processes, stop_within_s)
    except StartupInterruptedError:
        logger.info("stopped while starting")
        return 0
    finally:
        listening.close()
        shutil.rmtree(metrics_dir, ignore_errors=True)


def bind(host: str, port: int) -> socket.socket:
    """The one listening socket every API process accepts on."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listening = socket.socket(family, socket.SOCK_STREAM)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listening.bind((host, port))
    return listening


class StartupInterruptedError(Exception):
    """SIGTERM/SIGINT arrived before the group had started."""


class Supervisor:
    def __init__(self) -> None:
        self._api_processes: list[BaseProcess] = []
        self._stopping = False

    @contextlib.contextmanager
    def signals(self) -> Iterator[None]:
        """SIGTERM and SIGINT go to `_on_signal` while the group runs."""
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if not self._api_processes:  # still starting: stop at once
            raise StartupInterruptedError()
        logger.info("received %s: the API processes drain", signal.Signals(signum).name)
        self._stopping = True
        self._forward(signal.SIGTERM)  # a second signal makes them exit at once, as it would one

    def _forward(self, sig: int) -> None:
        for process in self._api_processes:
            if process.exitcode is None and process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, sig)

    def watch(
        self, api_processes: list[BaseProcess], engine_processes: list[BaseProcess], stop_within_s: float
    ) -> int:
        """Until every API process has exited: 0 when they drained on request, 1 on a failure.
        After a failure the others drain within `stop_within_s` (ENGINE_GONE_GRACE_S once the
        engine core is dead), or are killed: one still starting when the engine core died
        waited on it for ever, and the group never exited."""
        self._api_processes = api_processes
        logger.info(
            "API processes %s and engine core %s started",
            [p.pid for p in api_processes],
            [p.pid for p in engine_processes],
        )
        failed = False
        kill_at = math.inf
        while any(p.exitcode is None for p in api_processes):
            alive = [p.sentinel for p in api_processes if p.exitcode is None]
            connection.wait(alive + [p.sentinel for p in engine_processes], timeout=WATCH_INTERVAL_S)
            failure = self._failure(api_processes, engine_processes)
            if failure and not failed:
                failed = True
                logger.error("%s: stopping the group", failure)
                self._forward(signal.SIGTERM)
                engine_gone = any(p.exitcode is not None for p in engine_processes)
                kill_at = time.monotonic() + (ENGINE_GONE_GRACE_S if engine_gone else stop_within_s)
            if time.monotonic() > kill_at:
                stuck = [p.pid for p in api_processes if p.exitcode is None]
                logger.error("API processes %s did not stop after the failure: killed", stuck)
                self._forward(signal.SIGKILL)
                kill_at = math.inf
        for process in api_processes:
            mark_process_dead(process.pid)
        return 1 if failed else 0

    def _failure(self, api_processes: list[BaseProcess], engine_processes: list[BaseProcess]) -> str | None:
        for process in api_processes:
            if process.exitcode not in (None, 0):
                return f"API process {process.name} (pid {process.pid}) exited with {process.exitcode}"
            if process.exitcode == 0 and not self._stopping:
                return f"API process {process.name} (pid {process.pid}) exited unasked"
        for process in engine_processes:
            if process.exitcode is not None:
                return f"the engine core (pid {process.pid}) exited with {process.exitcode}"
        return None


def mark_process_dead(pid: int | None) -> None:
    """Drop a finished process's live gauges from the group's metrics."""
    from prometheus_client import multiprocess

    if pid is not None:
        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]


def run_api_process(listen_address: str, listening: socket.socket, args: Any, client: dict[str, Any]) -> None:
    """One API process of the group (spawned by vLLM's APIServerProcessManager)."""
    from llmserve.app import create_app
    from llmserve.engine.vllm_group import connect_vllm_engine
    from llmserve.server import run_http

    config, shared = args
    index = client["client_index"]
    name_process(f"{API_PROCESS_PREFIX}{index}")
    configure_logging(config.server.log_level, f"api-{index}")

    def starter(server_config: Config) -> Any:
        return connect_vllm_engine(server_config.engine, server_config.server.served_model_name, client)

    app = create_app(config, starter, group=shared)
    logger.info("API process %d serving on %s", index, listen_address)
    raise SystemExit(run_http(config, app, [listening]))


def name_process(name: str) -> None:
    """The name `ps`, `top` and psutil show (Linux; at most 15 bytes)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)
