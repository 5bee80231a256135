"""Run the app under uvicorn: drain on SIGTERM, and turn the engine's fate into the exit code."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from types import FrameType

import prometheus_client
import uvicorn
from fastapi import FastAPI

from llmserve.api.accept_queue import accept_queue, is_measurable
from llmserve.api.read_delay import ReadDelayHttpToolsProtocol
from llmserve.app import create_app
from llmserve.config import Config
from llmserve.metrics import GatewayMetrics
from llmserve.runtime import EngineRuntime

logger = logging.getLogger(__name__)


class DrainingServer(uvicorn.Server):
    """The first SIGTERM/SIGINT starts a drain: readiness turns false at once, new requests get
    503, in-flight requests get `shutdown_timeout_s` to finish (then an error), and the process
    exits once none is left. A second signal exits at once."""

    def __init__(self, config: uvicorn.Config, runtime: EngineRuntime, drain_timeout_s: float) -> None:
        super().__init__(config)
        self.runtime = runtime
        self.drain_timeout_s = drain_timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def listening_sockets(self) -> list[socket.socket]:
        """Where it accepts connections (none before it has started)."""
        return [sock for server in getattr(self, "servers", []) for sock in server.sockets]

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.runtime.draining or self._loop is None or not self.started:
            super().handle_exit(sig, frame)
            return
        logger.info("received %s: draining", signal.Signals(sig).name)
        self._loop.call_soon_threadsafe(self.runtime.begin_drain, self.drain_timeout_s)

    async def on_tick(self, counter: int) -> bool:
        if self.runtime.drained:
            self.should_exit = True
        return await super().on_tick(counter)


def serve(config: Config) -> int:
    """Serve until SIGTERM (exit 0 once drained) or until the engine fails (non-zero)."""
    if config.server.api_processes > 1:
        from llmserve.server_group import serve_group

        return serve_group(config)
    logger.info(
        "llmserve starting on http://%s:%d; loading model %s (ready when /ready says so)",
        config.server.host,
        config.server.port,
        config.engine.model,
    )
    return run_http(config, create_app(config))


def run_http(config: Config, app: FastAPI, sockets: list[socket.socket] | None = None) -> int:
    """Run `app` under uvicorn on host:port (or on `sockets`, a group's shared listening socket)."""
    # `*_created` timestamps are a quarter of the exposition and no dashboard reads them.
    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
    runtime: EngineRuntime = app.state.runtime
    server_config = config.server
    uvicorn_config = uvicorn.Config(
        app,
        host=server_config.host,
        port=server_config.port,
        log_level=server_config.log_level,
        loop="uvloop",
        http=ReadDelayHttpToolsProtocol,
        # The drain has already given requests their time; this only bounds stragglers.
        timeout_graceful_shutdown=5,
        access_log=False,
    )
    server = DrainingServer(uvicorn_config, runtime, server_config.shutdown_timeout_s)
    if is_measurable():
        metrics: GatewayMetrics = app.state.metrics
        metrics.watch_accept_queue(lambda: accept_queue(server.listening_sockets()))
    # uvicorn re-raises the signal it shut down for, after restoring the previous handler; with
    # this one in place a graceful SIGTERM ends in exit code 0 (1 if the engine failed).
    signal.signal(signal.SIGTERM, lambda *_: None)
    server.run(sockets)
    if not server.started:
        return 1
    return runtime.exit_code
