"""Calibrates admission's service model before the server reports ready: a few short greedy
generations alone and side by side give the engine's step time at two batch sizes and its
prefill rate, so the first burst after start-up (or after any idle time) meets a real estimate."""

from __future__ import annotations

import asyncio
import time
from contextlib import aclosing

from llmserve.engine.base import EngineClient, SamplingSpec
from llmserve.policy.service_model import ServiceModel

PROMPT = "Count from one to a hundred, one number per line: one, two, three, four, five,"
TOKENS = 8
BATCHES = (1, 8)


async def calibrate(engine: EngineClient, model: ServiceModel) -> None:
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
                elif count and previous is not None:
                    model.observe_step(batch, (now - previous) / count)
                previous = now if count else previous

    for batch in BATCHES:
        await asyncio.gather(*(one(batch, index) for index in range(batch)))
