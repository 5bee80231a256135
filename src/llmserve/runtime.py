"""The engine's life inside the server: start in the background, warm up, report readiness, stop.

HTTP is served while the engine starts (`/health` answers, `/ready` says 503 until the engine has
generated its first token), so supervisors can tell "starting" from "dead".
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

from llmserve.config import Config
from llmserve.deadlines import DeadlineBook
from llmserve.engine.base import EngineClient, EngineError, SamplingSpec

logger = logging.getLogger(__name__)

EngineStarter = Callable[[Config], AbstractAsyncContextManager[EngineClient]]
WARMUP_PROMPT = "Hello"


class EngineNotReadyError(EngineError):
    """The engine is still starting, or has stopped."""


class DrainingError(EngineError):
    """The server is shutting down: it finishes what it has and takes nothing new."""


class EngineRuntime:
    def __init__(self, config: Config, starter: EngineStarter, on_fatal: Callable[[], None]) -> None:
        self._config = config
        self._starter = starter
        self._on_fatal = on_fatal
        self._engine: EngineClient | None = None
        self._stop_requested = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.exit_code = 0
        self.ready_after_s: float | None = None
        self.deadlines = DeadlineBook()
        self.draining = False

    @property
    def is_ready(self) -> bool:
        return self._engine is not None and not self._engine.is_dead and not self.draining

    @property
    def is_failed(self) -> bool:
        return self.exit_code != 0 or (self._engine is not None and self._engine.is_dead)

    def engine(self) -> EngineClient:
        if self.draining:
            raise DrainingError("the server is shutting down")
        if self._engine is None:
            raise EngineNotReadyError("the inference engine is not ready")
        return self._engine

    def begin_drain(self, timeout_s: float) -> None:
        """Readiness turns false, new requests are refused, in-flight ones get `timeout_s` to finish."""
        if self.draining:
            return
        self.draining = True
        self.deadlines.drain(timeout_s)
        logger.info(
            "draining: %d request(s) in flight get up to %.0f s to finish", len(self.deadlines), timeout_s
        )

    @property
    def drained(self) -> bool:
        return self.draining and len(self.deadlines) == 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="llmserve-engine")

    async def stop(self) -> None:
        self._stop_requested.set()
        if self._task is not None:
            await self._task

    async def _run(self) -> None:
        started = time.monotonic()
        try:
            async with self._starter(self._config) as engine:
                if self._stop_requested.is_set():
                    return
                await warm_up(engine)
                self._engine = engine
                self.ready_after_s = time.monotonic() - started
                server = self._config.server
                logger.info(
                    "llmserve ready on http://%s:%d (model %s, engine ready after %.1f s)",
                    server.host,
                    server.port,
                    server.served_model_name,
                    self.ready_after_s,
                )
                await self._stop_requested.wait()
                self._engine = None
        except Exception:
            logger.exception("the inference engine failed; the server will exit")
            self._engine = None
            self.exit_code = 1
            self._on_fatal()


async def warm_up(engine: EngineClient) -> None:
    """Readiness means the engine really generated a token, not just that it was constructed."""
    prompt = await engine.tokenize(WARMUP_PROMPT)
    sampling = SamplingSpec(max_tokens=1, temperature=0.0)
    async for delta in engine.generate(prompt, sampling, "llmserve-warmup"):
        if delta.finished:
            return
    raise EngineError("the warm-up generation ended without finishing")
