"""Calibrates admission's service model before the server reports ready: a few short greedy
generations alone and side by side give the engine's step time at three batch sizes and its
prefill rate, and prompts of four lengths sent into a running batch give what a prompt adds
to the step that takes it in, so the first burst after start-up (or after any idle time) meets a
real estimate. (Without that last part the plane learned its prompt term only from the first
load's own steps: a fresh server predicted its first ramp as if prompts were free, 0 µs a token,
and those steps ran 1.5-2.5x the prediction.)

The batches reach far enough for the slope of the step in the batch to be measured, not
extrapolated: from batches of 1 and 8 alone, five calibrations on one engine (Intel Xeon with
AMX, bfloat16) predicted a step at 64 sequences of 37 to 129 ms against 60-69 ms measured, and a
server that started at the high end refused 7 requests at half load that every other server
answered in time; from 1, 16 and 48, 66 to 80 ms. Never beyond the engine's own batch
(max_num_seqs): vLLM would queue the rest.

Where the engine times its steps (vLLM: engine/step_stats.py), only its clock teaches the steps
(ServiceModel.observe_step), in calibration as in serving: the gaps between tokens relayed to 48
requests also held the API process's own work (105 ms a step against the engine's 68), and each
was a sample, 48 a step against the engine's one: ~450 samples that outweighed the first minute
of a load's (~9 a second), so a fresh server planned that minute on them. Calibrated by the
engine's ~120 steps, the fit is noisier (see TOKENS) but a load's own steps take it over within
seconds."""

from __future__ import annotations

import asyncio
import time
from contextlib import aclosing, suppress

from llmserve.engine.base import EngineClient, SamplingSpec
from llmserve.policy.service_model import ServiceModel

PROMPT = "Count from one to a hundred, one number per line: one, two, three, four, five,"
# Per batch: 8 gave 0.47-0.75 ms a sequence in four starts of one host (the engine's clock
# alone), 24 gave 0.66-0.75 against 0.78 fitted under load, for ~2 s more before ready.
TOKENS = 24
BATCHES = (1, 16, 48)
RUNNING = 4  # the batch the newcomers' prompts are taken into
NEWCOMER_PROMPT_REPEATS = (1, 2, 4, 8)  # a newcomer's prompt: this many times PROMPT
STEP_WAIT_S = 1.0  # at most this long for a running request's next token


def calibration_batches(engine_sequences: int) -> tuple[int, ...]:
    """BATCHES, none beyond the `engine_sequences` the engine runs at once."""
    return tuple(sorted({min(batch, engine_sequences) for batch in BATCHES}))


async def calibrate(engine: EngineClient, model: ServiceModel, engine_sequences: int) -> None:
    prompt = await engine.tokenize(PROMPT * 4)
    sampling = SamplingSpec(max_tokens=TOKENS, temperature=0.0, ignore_eos=True)

    async def one(batch: int, index: int) -> None:
        started = time.monotonic()
        previous: float | None = None
        generation = engine.generate(prompt, sampling, f"llmserve-calibration-{batch}-{index}")
        async with aclosing(generation) as deltas:
            async for delta in deltas:
                now, count = time.monotonic(), len(delta.token_ids)
                if count and previous is None:
                    model.observe_prefill(len(prompt.token_ids), now - started, batch)
                elif count and previous is not None:  # taught only where the engine keeps no clock
                    model.observe_step(batch, (now - previous) / count)
                previous = now if count else previous

    for batch in calibration_batches(engine_sequences):
        await asyncio.gather(*(one(batch, index) for index in range(batch)))
    await _prompts_into_a_running_batch(engine)


async def _prompts_into_a_running_batch(engine: EngineClient) -> None:
    """Newcomers of several prompt lengths, one at a time, while RUNNING requests keep decoding:
    the engine times each step by the running requests' tokens (engine/step_stats.py), so the
    steps that take a prompt in are samples of what its tokens cost."""
    newcomers = [await engine.tokenize(PROMPT * repeats) for repeats in NEWCOMER_PROMPT_REPEATS]
    running_prompt = await engine.tokenize(PROMPT)
    first = SamplingSpec(max_tokens=1, temperature=0.0, ignore_eos=True)
    # Long enough to outlast the newcomers; stopped once they are done.
    running = SamplingSpec(max_tokens=2 * TOKENS * (len(newcomers) + 1), temperature=0.0, ignore_eos=True)
    token = asyncio.Event()  # a running request got a token (or ended): the batch moved on
    newcomers_done = asyncio.Event()
    still_running = RUNNING

    async def keep_running(index: int) -> None:
        nonlocal still_running
        generation = engine.generate(running_prompt, running, f"llmserve-calibration-running-{index}")
        try:
            async with aclosing(generation) as deltas:
                async for delta in deltas:
                    if delta.token_ids:
                        token.set()
                    if newcomers_done.is_set():
                        return
        finally:
            still_running -= 1
            token.set()

    async def newcomers_one_by_one() -> None:
        for index, prompt in enumerate(newcomers):
            for _ in range(2):  # steps of decoding alone before each newcomer
                if not still_running:
                    break
                token.clear()
                with suppress(TimeoutError):
                    await asyncio.wait_for(token.wait(), STEP_WAIT_S)
            generation = engine.generate(prompt, first, f"llmserve-calibration-newcomer-{index}")
            async with aclosing(generation) as deltas:
                async for _ in deltas:
                    pass
        newcomers_done.set()

    await asyncio.gather(newcomers_one_by_one(), *(keep_running(index) for index in range(RUNNING)))
