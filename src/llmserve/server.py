"""Run the app under uvicorn and turn the engine's fate into the process exit code."""

from __future__ import annotations

import logging
import signal

import prometheus_client
import uvicorn

from llmserve.app import create_app
from llmserve.config import Config
from llmserve.runtime import EngineRuntime

logger = logging.getLogger(__name__)


def serve(config: Config) -> int:
    # `*_created` timestamps are a quarter of the exposition and no dashboard reads them.
    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
    app = create_app(config)
    server_config = config.server
    uvicorn_config = uvicorn.Config(
        app,
        host=server_config.host,
        port=server_config.port,
        log_level=server_config.log_level,
        loop="uvloop",
        http="httptools",
        timeout_graceful_shutdown=int(server_config.shutdown_timeout_s),
        access_log=False,
    )
    logger.info(
        "llmserve starting on http://%s:%d; loading model %s (ready when /ready says so)",
        server_config.host,
        server_config.port,
        config.engine.model,
    )
    server = uvicorn.Server(uvicorn_config)
    # uvicorn re-raises the signal it shut down for, after restoring the previous handler; with
    # this one in place a graceful SIGTERM ends in exit code 0 (1 if the engine failed).
    signal.signal(signal.SIGTERM, lambda *_: None)
    server.run()
    runtime: EngineRuntime = app.state.runtime
    if not server.started:
        return 1
    return runtime.exit_code
