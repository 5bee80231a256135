"""The engine's step times by its own clock, from vLLM's per-step statistics.

Admission's service model needs the time one engine step takes at the batch running. Measured in
the API process, between two relayed deltas, that time also holds whatever kept the event loop
busy: while the process takes in a burst of a few hundred requests, tokens are relayed late, and
the model learned steps 4x their real length and refused what it could have served. vLLM already
times every step in the engine core (`EngineCoreOutputs.timestamp`) and hands each request's
inter-token latency by that clock, with the scheduler's running count, to its stat loggers; a
stat logger of our own passes them on: one sample per step, the median over the requests that
got a token in it, with the prompt tokens whose prefill the step finished.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeAlias

from llmserve.engine.base import StepListener

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.metrics.loggers import StatLoggerBase

StatLoggers: TypeAlias = "list[Callable[[VllmConfig, int], StatLoggerBase]]"


class StepTimes:
    """Where vLLM's stat logger delivers step times; `listener` is set once someone listens."""

    def __init__(self) -> None:
        self.listener: StepListener | None = None

    def deliver(self, inter_token_latencies: list[float], running: int | None, prompt_tokens: int) -> None:
        if self.listener is not None and inter_token_latencies:
            self.listener(statistics.median(inter_token_latencies), running, prompt_tokens)

    def stat_logger_factory(self) -> Callable[[VllmConfig, int], StatLoggerBase]:
        """For `AsyncLLM(stat_loggers=[...])`: one logger per engine core, all delivering here."""
        from vllm.v1.metrics.loggers import StatLoggerBase

        times = self

        class StepTimeLogger(StatLoggerBase):
            def __init__(self, vllm_config: VllmConfig, engine_index: int = 0) -> None:
                pass

            def record(
                self,
                scheduler_stats: Any,
                iteration_stats: Any,
                mm_cache_stats: Any = None,
                engine_idx: int = 0,
            ) -> None:
                if iteration_stats is not None:
                    running = None if scheduler_stats is None else scheduler_stats.num_running_reqs
                    times.deliver(
                        iteration_stats.inter_token_latencies_iter, running, iteration_stats.num_prompt_tokens
                    )

            def log_engine_initialized(self) -> None:
                pass

        return StepTimeLogger
