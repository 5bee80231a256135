"""create_app(): the FastAPI application, built in a factory with no import-time state."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI

from llmserve import __version__
from llmserve.api import chat, completions, health, models, scrape
from llmserve.api.auth import ApiKeyRequired, KeyRing
from llmserve.api.body_limit import BodyLimitsMiddleware
from llmserve.api.deps import Generation
from llmserve.api.errors import install_error_handlers
from llmserve.api.load_shed import LoadShedMiddleware
from llmserve.api.observability import MetricsMiddleware
from llmserve.api.openapi import install_openapi
from llmserve.config import Config
from llmserve.engine import start_engine
from llmserve.metrics import GatewayMetrics
from llmserve.policy.admission import Admission
from llmserve.policy.permits import Permits
from llmserve.policy.rate_limits import RateLimiter
from llmserve.policy.shared_state import SharedState
from llmserve.runtime import EngineRuntime, EngineStarter
from llmserve.serving.chat import ChatService
from llmserve.serving.completions import CompletionService
from llmserve.serving.pipeline import Pipeline

GAUGE_PUBLISH_INTERVAL_S = 1.0


def _terminate_self() -> None:
    """Ask the server to shut down as if a supervisor had sent SIGTERM."""
    os.kill(os.getpid(), signal.SIGTERM)


async def publish_gauges(metrics: GatewayMetrics) -> None:
    """In a group, a scrape reads every process's gauges from files: keep this one's current."""
    while True:
        metrics.refresh()
        await asyncio.sleep(GAUGE_PUBLISH_INTERVAL_S)


def create_app(
    config: Config,
    engine_starter: EngineStarter | None = None,
    on_fatal: Callable[[], None] = _terminate_self,
    group: SharedState | None = None,
) -> FastAPI:
    """`group`: the limits' state shared with the other API processes of a group (else this
    process's own)."""
    admission = Admission(
        config.admission,
        config.slo,
        load=group.engine_load() if group else None,
        engine_sequences=config.engine.max_num_seqs,
    )
    permits = Permits(admission, RateLimiter(config.auth, shared=group))
    calibration_lock = group.calibration_lock if group else None
    runtime = EngineRuntime(config, engine_starter or start_engine, on_fatal, permits, calibration_lock)
    gateway_metrics = GatewayMetrics(config.server.served_model_name, multiprocess=group is not None)
    gateway_metrics.watch_queue(waiting=lambda: admission.waiting, in_flight=permits.in_flight)
    most = config.admission.max_in_flight
    gateway_metrics.watch_service_model(
        admission.model.step_s,
        tuple(sorted({1, max(1, most // 4), most})),
        admission.model.prefill_s,
        headroom=lambda: admission.headroom.share,
        batch_limit=admission.batch_limit,
    )
    generation = Generation(
        pipeline=Pipeline(config, runtime, permits),
        completions=CompletionService(config.server.served_model_name, config.admission.max_prompt_tokens),
        chat=ChatService(config.server.served_model_name, config.admission.max_prompt_tokens),
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        runtime.start()
        publisher = asyncio.create_task(publish_gauges(gateway_metrics)) if group else None
        try:
            yield
        finally:
            if publisher is not None:
                publisher.cancel()
            await runtime.stop()

    app = FastAPI(
        title="llmserve",
        version=__version__,
        summary="OpenAI-compatible API in front of vLLM",
        lifespan=lifespan,
    )
    app.state.config = config
    app.state.runtime = runtime
    app.state.metrics = gateway_metrics
    app.state.generation = generation
    app.state.permits = permits
    app.state.keys = KeyRing.from_config(config.auth)
    app.add_middleware(LoadShedMiddleware, admission=admission)
    app.add_middleware(
        BodyLimitsMiddleware,
        max_body_bytes=config.server.max_request_body_bytes,
        read_timeout_s=config.server.body_read_timeout_s,
    )
    # Added last, so outermost: every request is observed, also those refused for their size.
    app.add_middleware(MetricsMiddleware, metrics=gateway_metrics)
    install_error_handlers(app)
    install_openapi(app, config.server.served_model_name, lambda: runtime.vocab_size)
    for module in (completions, chat, models):
        app.include_router(module.router, dependencies=[ApiKeyRequired])
    app.include_router(health.router)
    app.include_router(scrape.router, dependencies=[ApiKeyRequired] if config.auth.protect_metrics else [])
    return app
