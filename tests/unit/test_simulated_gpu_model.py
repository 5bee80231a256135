"""The simulated GPU's arithmetic (engine/step_time.py): a step takes what a roofline of the named
GPU gives for the batch vLLM scheduled, and a request samples a token exactly when vLLM's model
runner would. No vLLM here: scheduler outputs are stood in by plain objects of the same fields."""

from __future__ import annotations

import typing
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from llmserve.config import ConfigError, load_config
from llmserve.engine.step_time import (
    CONFIG_KEY,
    EXECUTOR_CLASS,
    GPUS,
    ModelShape,
    RequestStep,
    SimulatedTokens,
    StepTimeModel,
    sampled_tokens,
    simulation_settings,
)
from llmserve.engine.vllm_engine import engine_arguments
from llmserve.engine_config import SimulatedGpuName

REPO = Path(__file__).resolve().parents[2]
# SmolLM2-135M-Instruct's config.json.
SMOLLM2 = SimpleNamespace(
    num_hidden_layers=30, hidden_size=576, num_attention_heads=9, num_key_value_heads=3,
    intermediate_size=1536, vocab_size=49152,
)  # fmt: skip


def model(overhead_ms: float = 1.5) -> StepTimeModel:
    return StepTimeModel(
        gpu=GPUS["H200"],
        model=ModelShape.from_hf_config(SMOLLM2, weight_bytes=2, kv_bytes=2),
        overhead_s=overhead_ms / 1000,
        bandwidth_efficiency=0.8,
        compute_efficiency=0.5,
    )


def decode(batch: int, context: int = 100) -> list[RequestStep]:
    return [RequestStep(scheduled=1, cached=context, samples=True)] * batch


def test_the_model_shape_counts_smollm2s_135m_parameters_and_its_kv_bytes() -> None:
    shape = model().model
    assert shape.weight_bytes / 2 == pytest.approx(134.5e6, rel=0.01)
    assert shape.kv_bytes_per_token == 2 * 30 * 3 * 64 * 2  # K and V, layers, KV heads, head dim, bf16


def test_a_small_decode_batch_is_memory_bound_reading_the_weights_once() -> None:
    step = model(overhead_ms=0).step_seconds(decode(1))
    reads = model().model.weight_bytes + 101 * model().model.kv_bytes_per_token
    assert step == pytest.approx(reads / (4.8e12 * 0.8))


def test_a_long_prefill_is_compute_bound() -> None:
    shape = model().model
    prefill = [RequestStep(scheduled=8192, cached=0, samples=True)]
    step = model(overhead_ms=0).step_seconds(prefill)
    assert step > shape.weight_bytes / (4.8e12 * 0.8) * 10
    assert step >= 2 * shape.layer_parameters * 8192 / (989.5e12 * 0.5)


def test_steps_cost_the_fixed_overhead_and_grow_with_the_batch_and_its_context() -> None:
    times = [model().step_seconds(decode(batch)) for batch in (1, 16, 256, 1024)]
    assert times == sorted(times)
    assert times[0] >= 0.0015
    assert model().step_seconds(decode(64, context=2000)) > model().step_seconds(decode(64, context=10))
    assert model().step_seconds([]) == 0.0


def test_named_gpus_differ_as_their_datasheets_do() -> None:
    batch = decode(8)
    h200 = model(overhead_ms=0)
    l4 = StepTimeModel(GPUS["L4"], h200.model, 0, 0.8, 0.5)
    assert l4.step_seconds(batch) / h200.step_seconds(batch) == pytest.approx(4.8e12 / 300e9, rel=0.01)
    assert set(typing.get_args(SimulatedGpuName)) == set(GPUS)


def step(
    new: list[tuple[str, int, int]] = (),  # type: ignore[assignment]
    cached: list[tuple[str, int, int]] = (),  # type: ignore[assignment]
    scheduled: dict[str, int] | None = None,
    finished: set[str] | None = None,
) -> Any:
    """A stand-in for vLLM's SchedulerOutput: (id, prompt length, computed) for new requests,
    (id, computed, outputs so far) for cached ones."""
    return SimpleNamespace(
        scheduled_new_reqs=[
            SimpleNamespace(req_id=rid, prompt_token_ids=[7] * length, num_computed_tokens=computed)
            for rid, length, computed in new
        ],
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=[rid for rid, *_ in cached],
            num_computed_tokens=[computed for _, computed, _ in cached],
            num_output_tokens=[outputs for *_, outputs in cached],
        ),
        num_scheduled_tokens=scheduled or {},
        finished_req_ids=finished or set(),
    )


def test_a_prompt_in_chunks_samples_only_after_its_last_chunk_then_one_token_per_step() -> None:
    prompts: dict[str, int] = {}
    tokens = SimulatedTokens(49152)
    first, batch = sampled_tokens(step(new=[("a", 300, 0)], scheduled={"a": 256}), prompts, tokens)
    assert first == {"a": []}
    assert batch == [RequestStep(256, 0, False)]
    second, _ = sampled_tokens(step(cached=[("a", 256, 0)], scheduled={"a": 44}), prompts, tokens)
    assert len(second["a"]) == 1
    third, batch = sampled_tokens(step(cached=[("a", 300, 1)], scheduled={"a": 1}), prompts, tokens)
    assert len(third["a"]) == 1
    assert batch == [RequestStep(1, 300, True)]
    sampled_tokens(step(finished={"a"}), prompts, tokens)
    assert prompts == {}


def test_a_prefix_cache_hit_and_a_resumed_request_sample_when_they_reach_their_end() -> None:
    prompts: dict[str, int] = {}
    tokens = SimulatedTokens(49152)
    hit, batch = sampled_tokens(step(new=[("a", 300, 256)], scheduled={"a": 44}), prompts, tokens)
    assert len(hit["a"]) == 1
    assert batch[0].cached == 256
    # Preempted after 5 outputs: it recomputes prompt and outputs, and samples at the end of them.
    resumed, _ = sampled_tokens(step(cached=[("a", 0, 5)], scheduled={"a": 304}), prompts, tokens)
    assert resumed["a"] == []
    done, _ = sampled_tokens(step(cached=[("a", 304, 5)], scheduled={"a": 1}), prompts, tokens)
    assert len(done["a"]) == 1


def test_simulated_tokens_are_ordinary_vocabulary_and_the_same_on_a_rerun() -> None:
    tokens = SimulatedTokens(49152)
    ids = [tokens.token(f"req-{r}", position) for r in range(50) for position in range(100)]
    assert min(ids) >= 49152 // 8
    assert max(ids) < 49152 // 2
    assert len(set(ids)) > 1000
    assert ids == [SimulatedTokens(49152).token(f"req-{r}", p) for r in range(50) for p in range(100)]


def simulated_profile() -> Any:
    return load_config(REPO / "configs" / "sim-h200-smollm2.yaml")


def test_the_simulated_profile_runs_vllm_with_the_simulated_executor_and_says_so() -> None:
    config = simulated_profile()
    assert "simulated" in config.server.served_model_name
    arguments = engine_arguments(config.engine, config.server.served_model_name)
    assert arguments["distributed_executor_backend"] == EXECUTOR_CLASS
    settings = simulation_settings(arguments["additional_config"])
    assert settings.gpu == "H200"
    plain = engine_arguments(load_config(REPO / "configs" / "cpu-smollm2.yaml").engine, "m")
    assert CONFIG_KEY not in plain["additional_config"], "never the default"
    assert plain["distributed_executor_backend"] is None


@pytest.mark.parametrize(
    ("engine", "problem"),
    [
        ({"speculative": {"method": "suffix", "num_speculative_tokens": 2}}, "no speculation"),
        ({"tensor_parallel_size": 2}, "no speculation, parallelism"),
        ({"distributed_executor_backend": "mp"}, "distributed_executor_backend unset"),
        ({"simulated_gpu": {"gpu": "B200"}}, "H200"),
    ],
)
def test_a_simulation_of_what_it_cannot_model_is_a_config_error(engine: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(REPO / "configs" / "sim-h200-smollm2.yaml", {"engine": engine})
    assert problem in str(caught.value)
