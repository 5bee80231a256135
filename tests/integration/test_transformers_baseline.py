"""The transformers static-batching baseline behind the engine protocol (real SmolLM2, in-process)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmserve.config import load_config
from llmserve.engine.base import GenerationDelta, SamplingSpec
from llmserve.engine.transformers_engine import TransformersEngine, start_transformers_engine
from llmserve.errors import EngineRefusedError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
async def baseline() -> AsyncIterator[TransformersEngine]:
    config = load_config(REPO / "configs" / "cpu-smollm2.yaml", {"engine": {"backend": "transformers"}})
    async with start_transformers_engine(config.engine) as engine:
        yield engine


async def complete(
    engine: TransformersEngine, prompt: str, sampling: SamplingSpec, rid: str
) -> GenerationDelta:
    deltas = [d async for d in engine.generate(await engine.tokenize(prompt), sampling, rid)]
    assert len(deltas) == 1, "static batching answers once, with everything"
    return deltas[0]


async def test_one_batch_serves_requests_of_different_lengths_each_to_its_own_end(
    baseline: TransformersEngine,
) -> None:
    prompts = ["The capital of France is", "1, 2, 3, 4,", "Once upon a time"]
    lengths = [3, 9, 6]
    results = await asyncio.gather(
        *(
            complete(baseline, p, SamplingSpec(max_tokens=n, temperature=0, ignore_eos=True), f"r{i}")
            for i, (p, n) in enumerate(zip(prompts, lengths, strict=True))
        )
    )
    assert [len(r.token_ids) for r in results] == lengths
    assert all(r.finish_reason == "length" for r in results)
    assert "Paris" in results[0].text


async def test_greedy_is_deterministic_and_stop_strings_cut_the_text(baseline: TransformersEngine) -> None:
    sampling = SamplingSpec(max_tokens=12, temperature=0)
    first = await complete(baseline, "1, 2, 3, 4,", sampling, "a")
    again = await complete(baseline, "1, 2, 3, 4,", sampling, "b")
    assert first.text == again.text
    cut = await complete(
        baseline, "1, 2, 3, 4,", SamplingSpec(max_tokens=12, temperature=0, stop=("7",)), "c"
    )
    assert cut.finish_reason == "stop"
    assert "7" not in cut.text
    assert first.text.startswith(cut.text)


async def test_features_static_batching_lacks_are_refused_by_name(baseline: TransformersEngine) -> None:
    prompt = await baseline.tokenize("Hi")
    with pytest.raises(EngineRefusedError, match="logprobs"):
        async for _ in baseline.generate(prompt, SamplingSpec(max_tokens=2, logprobs=1), "x"):
            pass
