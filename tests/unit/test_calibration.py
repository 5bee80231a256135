"""Calibration: far enough to measure the step's slope in the batch, never beyond what the engine
runs at once, and by the engine's own clock where it has one."""

from collections.abc import AsyncGenerator

import pytest

from llmserve.engine.base import GenerationDelta, SamplingSpec, StepListener, TokenizedPrompt
from llmserve.policy.service_model import ServiceModel
from llmserve.serving.calibration import calibrate, calibration_batches
from tests.fake_engine import FakeEngine

ENGINE_STEP_S = 0.001  # a step by the engine's clock
RELAY_GAP_S = 0.01  # the gap between two tokens as the API process relays them


@pytest.mark.parametrize(
    ("engine_sequences", "batches"),
    [(64, (1, 16, 48)), (512, (1, 16, 48)), (32, (1, 16, 32)), (8, (1, 8)), (1, (1,))],
)
def test_calibration_measures_up_to_a_large_batch_but_never_beyond_the_engines_own(
    engine_sequences: int, batches: tuple[int, ...]
) -> None:
    assert calibration_batches(engine_sequences) == batches


class EngineTimingItsSteps(FakeEngine):
    """Times every step at ENGINE_STEP_S by its own clock (as vLLM does: engine/step_stats.py),
    while its tokens reach the API process RELAY_GAP_S apart."""

    def __init__(self) -> None:
        super().__init__(max_model_len=4096)
        self.token_delay_s = RELAY_GAP_S
        self.listener: StepListener | None = None
        self.running = 0

    def watch_steps(self, listener: StepListener) -> None:
        self.listener = listener

    async def generate(
        self, prompt: TokenizedPrompt, sampling: SamplingSpec, request_id: str
    ) -> AsyncGenerator[GenerationDelta, None]:
        self.running += 1
        try:
            async for delta in super().generate(prompt, sampling, request_id):
                if self.listener is not None:
                    self.listener(ENGINE_STEP_S, self.running, 0)
                yield delta
        finally:
            self.running -= 1


async def test_where_the_engine_times_its_steps_calibration_learns_its_clock_not_the_relay_gaps() -> None:
    # Relayed, the gaps also hold the API process's own work: at a batch of 48 on the CPU they
    # were 1.5x the engine's steps, and a fresh server planned its first loads on them.
    engine, model = EngineTimingItsSteps(), ServiceModel()
    engine.watch_steps(
        lambda seconds, running, prompt_tokens: model.observe_engine_step(
            running or 1, seconds, prompt_tokens
        )
    )

    await calibrate(engine, model, engine_sequences=8)

    assert model.step_s(8, corrected=False) < 2 * ENGINE_STEP_S


async def test_where_the_engine_does_not_time_its_steps_calibration_learns_from_the_relay_gaps() -> None:
    engine, model = FakeEngine(max_model_len=4096), ServiceModel()
    engine.token_delay_s = RELAY_GAP_S

    await calibrate(engine, model, engine_sequences=8)

    assert model.step_s(8, corrected=False) == pytest.approx(RELAY_GAP_S, rel=0.5)
