"""The engine's life inside the server: start in the background, warm up, report readiness, stop.

HTTP is served while the engine starts (`/health` answers, `/ready` says 503 until the engine has
generated its first token), so supervisors can tell "starting" from "dead".
"""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, aclosing, asynccontextmanager
from typing import Any

from llmserve.config import Config
from llmserve.engine.base import EngineClient, SamplingSpec
from llmserve.errors import (
    DrainingError,
    EngineDeadError,
    EngineFailedError,
    EngineNotReadyError,
    EngineRefusedError,
)
from llmserve.policy.permits import Permits
from llmserve.serving.calibration import calibrate

logger = logging.getLogger(__name__)

EngineStarter = Callable[[Config], AbstractAsyncContextManager[EngineClient]]
WARMUP_PROMPT = "Hello"
WATCHDOG_INTERVAL_S = 1.0
CALIBRATION_LOCK_TIMEOUT_S = 300.0


class EngineRuntime:
    def __init__(
        self,
        config: Config,
        starter: EngineStarter,
        on_fatal: Callable[[], None],
        permits: Permits,
        calibration_lock: Any = None,
    ) -> None:
        self._config = config
        self._starter = starter
        self._on_fatal = on_fatal
        self._engine: EngineClient | None = None
        self._stop_requested = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.exit_code = 0
        self.ready_after_s: float | None = None
        self._permits = permits
        self.draining = False
        self._probe: asyncio.Task[bool] | None = None
        self._probed_ok_at = -math.inf
        self._probes_failing_since: float | None = None
        # A group's API processes calibrate one at a time: side by side each would measure the
        # others' batches as its own (a multiprocessing lock; None with one API process).
        self._calibration_lock = calibration_lock

    @property
    def is_ready(self) -> bool:
        return self._engine is not None and not self._engine.is_dead and not self.draining

    @property
    def vocab_size(self) -> int | None:
        """The served model's vocabulary, once the engine has started."""
        return self._engine.model_info.vocab_size if self._engine is not None else None

    @property
    def is_failed(self) -> bool:
        return self.exit_code != 0 or (self._engine is not None and self._engine.is_dead)

    def engine(self) -> EngineClient:
        if self.draining:
            raise DrainingError()
        if self._engine is None:
            raise EngineNotReadyError()
        return self._engine

    def begin_drain(self, timeout_s: float) -> None:
        """Readiness turns false, new requests are refused, in-flight ones get `timeout_s` to finish."""
        if self.draining:
            return
        self.draining = True
        self._permits.drain(timeout_s)
        logger.info(
            "draining: %d request(s) in flight get up to %.0f s to finish",
            self._permits.in_flight(),
            timeout_s,
        )

    async def probe(self) -> bool:
        """Readiness: the engine generated a token within the last `readiness_probe_ttl_s`.

        Concurrent callers share one probe; a probe that fails or times out means not ready, and
        so does one that succeeds after a drain began while it ran."""
        if not self.is_ready:
            return False
        server = self._config.server
        if time.monotonic() - self._probed_ok_at < server.readiness_probe_ttl_s:
            return True
        if self._probe is None or self._probe.done():
            self._probe = asyncio.create_task(self._run_probe(self.engine()))
        return await asyncio.shield(self._probe) and self.is_ready

    async def _run_probe(self, engine: EngineClient) -> bool:
        started = time.monotonic()
        try:
            async with asyncio.timeout(self._config.server.readiness_probe_timeout_s):
                await warm_up(engine)
        except (TimeoutError, EngineFailedError, EngineDeadError, EngineRefusedError):
            logger.warning("readiness probe: the engine did not generate a token in time")
            if self._probes_failing_since is None:
                self._probes_failing_since = started
            return False
        self._probes_failing_since = None
        self._probed_ok_at = time.monotonic()
        return True

    def _engine_is_stuck(self) -> bool:
        """Readiness probes have failed without a success for engine_hang_timeout_s."""
        since = self._probes_failing_since
        return since is not None and time.monotonic() - since > self._config.server.engine_hang_timeout_s

    async def _watch(self, engine: EngineClient) -> None:
        """A dead or hung engine ends the process with a non-zero exit, so a supervisor restarts it."""
        while not self._stop_requested.is_set():
            if engine.is_dead or self._engine_is_stuck():
                logger.error(
                    "the inference engine %s; the server will exit", "died" if engine.is_dead else "hangs"
                )
                self.exit_code = 1
                self._on_fatal()
                return
            await asyncio.sleep(WATCHDOG_INTERVAL_S)

    @property
    def drained(self) -> bool:
        return self.draining and self._permits.in_flight() == 0

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
                admission = self._permits.admission
                admission.kv_capacity_tokens = engine.model_info.kv_cache_tokens
                engine.watch_steps(admission.observe_engine_step)  # calibration's steps teach it too
                async with holding(self._calibration_lock):
                    await calibrate(engine, admission.model, self._config.engine.max_num_seqs)
                logger.info("admission's service model: %s", admission.model.describe())
                freeze_startup_heap()
                self._probed_ok_at = time.monotonic()
                self._engine = engine
                watchdog = asyncio.create_task(self._watch(engine))
                self.ready_after_s = time.monotonic() - started
                defaults = engine.model_info.sampling_defaults.in_effect()
                logger.info(
                    "sampling defaults for fields a request omits: %s (engine.generation_config: %s)",
                    defaults or "OpenAI's",
                    self._config.engine.generation_config,
                )
                server = self._config.server
                logger.info(
                    "llmserve ready on http://%s:%d (model %s, engine ready after %.1f s)",
                    server.host,
                    server.port,
                    server.served_model_name,
                    self.ready_after_s,
                )
                await self._stop_requested.wait()
                gc.unfreeze()
                watchdog.cancel()
                self._engine = None
        except Exception:
            logger.exception("the inference engine failed; the server will exit")
            self._engine = None
            self.exit_code = 1
            self._on_fatal()


@asynccontextmanager
async def holding(lock: Any) -> AsyncIterator[None]:
    """Hold a multiprocessing lock (None: nothing to hold) without blocking the event loop."""
    if lock is None:
        yield
        return
    if not await asyncio.to_thread(lock.acquire, True, CALIBRATION_LOCK_TIMEOUT_S):
        raise EngineFailedError("another API process held the calibration lock too long")
    try:
        yield
    finally:
        lock.release()


def freeze_startup_heap() -> None:
    """Move what start-up left (~600,000 objects of vLLM, torch, transformers) out of the garbage
    collector's sight, as vLLM's own server does (`vllm.utils.gc_utils.freeze_gc_heap`): otherwise
    every generation-2 collection walks them on the event loop, and those pauses were the p99 tail."""
    gc.collect()
    gc.freeze()


async def warm_up(engine: EngineClient) -> None:
    """Readiness means the engine really generated a token, not just that it was constructed."""
    prompt = await engine.tokenize(WARMUP_PROMPT)
    sampling = SamplingSpec(max_tokens=1, temperature=0.0)
    async with aclosing(engine.generate(prompt, sampling, "llmserve-warmup")) as deltas:
        async for delta in deltas:
            if delta.finished:
                return
    raise EngineFailedError("the warm-up generation ended without finishing")
