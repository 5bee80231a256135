"""Every serving technique is a validated profile: each builds vLLM's engine arguments without a GPU,
and an impossible combination is a config error that names the problem before vLLM starts."""

from __future__ import annotations

import json
import typing
from pathlib import Path
from typing import Any

import pytest

from llmserve.config import ConfigError, load_config, parse_overrides
from llmserve.engine.model_fit import ModelFitError, check_model_fit, model_fit_problems
from llmserve.engine.vllm_engine import build_engine_args, engine_arguments
from llmserve.engine_config import KvCacheDtype, Quantization, SpeculativeMethod

REPO = Path(__file__).resolve().parents[2]
PROFILES = sorted((REPO / "configs").glob("*.yaml"))
GPU_PROFILES = [p for p in PROFILES if p.name.startswith("gpu-")]

# The published config.json numbers of the models the GPU profiles name (by directory name).
LLAMA_2_7B = {"num_attention_heads": 32, "num_key_value_heads": 32, "num_hidden_layers": 32,
              "max_position_embeddings": 4096}  # fmt: skip
LLAMA_3_8B = {"num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
              "max_position_embeddings": 8192}  # fmt: skip
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "Llama-2-7b-chat-hf": LLAMA_2_7B,
    "Llama-2-7B-Chat-AWQ": {**LLAMA_2_7B, "quantization_config": {"quant_method": "awq", "bits": 4}},
    "Meta-Llama-3-8B-Instruct": LLAMA_3_8B,
    "Meta-Llama-3-8B-Instruct-quantized.w8a8": {
        **LLAMA_3_8B,
        "quantization_config": {"quant_method": "compressed-tensors"},
    },
    "Llama-3.1-8B-Instruct": {**LLAMA_3_8B, "max_position_embeddings": 131072},
    "Meta-Llama-3-70B-Instruct": {
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "num_hidden_layers": 80,
        "max_position_embeddings": 8192,
    },
}
SMOLLM2 = {"num_attention_heads": 9, "num_key_value_heads": 3, "num_hidden_layers": 30,
           "max_position_embeddings": 8192}  # fmt: skip


def engine_config(**engine: Any) -> Any:
    return load_config(REPO / "configs" / "cpu-smollm2.yaml", {"engine": engine}).engine


def config_error(**engine: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        engine_config(**engine)
    return str(caught.value)


def test_the_profiles_cover_every_technique_the_docs_document() -> None:
    names = {p.name for p in PROFILES}
    assert {
        "cpu-smollm2.yaml",
        "cpu-smollm2-spec-ngram.yaml",
        "gpu-llama3-8b-tp4.yaml",
        "gpu-llama2-7b-spec-draft.yaml",
        "gpu-llama3.1-8b-eagle3.yaml",
        "gpu-llama2-7b-awq.yaml",
        "gpu-llama3-8b-fp8.yaml",
        "gpu-llama3-8b-int8-w8a8.yaml",
        "gpu-llama3-70b-pp2-tp8-ray.yaml",
    } <= names
    pages = ("techniques.md", "operations.md", "configuration.md")
    docs = "".join((REPO / "docs" / page).read_text() for page in pages)
    for profile in PROFILES:
        assert f"configs/{profile.name}" in docs, f"the docs do not mention {profile.name}"


@pytest.mark.parametrize("profile", PROFILES, ids=[p.name for p in PROFILES])
def test_every_profile_builds_vllm_engine_args_without_a_gpu(profile: Path, tmp_path: Path) -> None:
    config = load_config(profile)
    engine = config.engine
    if not engine.model.exists():
        # vLLM resolves the model path when the arguments are built (HF_HUB_OFFLINE): stand in
        # an empty directory of the same name for models that live on GPU hosts.
        (tmp_path / engine.model.name).mkdir()
        engine = engine.model_copy(update={"model": tmp_path / engine.model.name})
    args = build_engine_args(engine, config.server.served_model_name)
    assert args.model == str(engine.model)
    assert args.tensor_parallel_size == engine.tensor_parallel_size
    assert args.pipeline_parallel_size == engine.pipeline_parallel_size
    assert args.quantization == engine.quantization
    assert args.kv_cache_dtype == engine.kv_cache_dtype
    if engine.speculative is not None:
        assert args.speculative_config is not None
        assert args.speculative_config["method"] == engine.speculative.method
    else:
        assert args.speculative_config is None


@pytest.mark.parametrize("profile", GPU_PROFILES, ids=[p.name for p in GPU_PROFILES])
def test_every_gpu_profile_fits_its_models_published_architecture(profile: Path, tmp_path: Path) -> None:
    config = load_config(profile).engine
    assert config.device == "cuda"
    architecture = ARCHITECTURES[config.model.name]
    model_dir = tmp_path / config.model.name
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(architecture))
    check_model_fit(config.model_copy(update={"model": model_dir}))


def test_profile_literals_are_values_vllm_accepts() -> None:
    from vllm.config.cache import CacheDType
    from vllm.config.speculative import SpeculativeMethod as VllmSpeculativeMethod
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS

    def values(literal: Any) -> set[str]:
        flat: set[str] = set()
        for arg in typing.get_args(literal):
            flat |= values(arg) if typing.get_origin(arg) is typing.Literal else {arg}
        return flat

    assert values(SpeculativeMethod) <= values(VllmSpeculativeMethod)
    assert values(KvCacheDtype) <= values(CacheDType)
    assert values(Quantization) <= set(QUANTIZATION_METHODS)


def test_ngram_speculation_maps_to_vllms_speculative_config_with_its_batch_size_schedule() -> None:
    config = load_config(REPO / "configs" / "cpu-smollm2-spec-ngram.yaml").engine
    arguments = engine_arguments(config, "m")["speculative_config"]
    schedule = arguments.pop("num_speculative_tokens_per_batch_size")
    assert arguments == {
        "method": "ngram",
        "num_speculative_tokens": 8,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 4,
    }
    assert schedule[0][0] == 1, "the schedule starts at a batch of one"
    assert schedule[-1][1] >= config.max_num_seqs, "and covers every batch the engine can run"
    # Derived from measurement (make bench-spec), not assumed monotone: past 32 streams 4 tokens
    # measured as fast as 2 (both ~0.58x plain), and the rule keeps what the run measured.
    assert schedule[0][2] == max(tokens for *_, tokens in schedule), "most drafted for one stream"


def test_suffix_decoding_maps_to_vllms_speculative_config() -> None:
    config = load_config(REPO / "configs" / "cpu-smollm2-spec-suffix.yaml").engine
    assert engine_arguments(config, "m")["speculative_config"] == {
        "method": "suffix",
        "num_speculative_tokens": 8,
        "suffix_decoding_max_tree_depth": 24,
        "suffix_decoding_max_spec_factor": 1.0,
        "suffix_decoding_min_token_prob": 0.1,
    }


def test_suffix_decoding_without_its_package_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "arctic_inference" else real_find_spec(name, *a),
    )
    config = load_config(REPO / "configs" / "cpu-smollm2-spec-suffix.yaml").engine
    with pytest.raises(ModelFitError, match="arctic-inference"):
        check_model_fit(config)


def ngram(**speculative: Any) -> dict[str, Any]:
    return {
        "speculative": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, **speculative}
    }


SCHEDULE = "num_speculative_tokens_per_batch_size"


@pytest.mark.parametrize(
    ("engine", "message"),
    [
        ({"speculative": {"method": "eagle", "num_speculative_tokens": 3}}, "needs speculative.model"),
        ({"speculative": {"method": "draft_model", "num_speculative_tokens": 3}}, "needs speculative.model"),
        (
            {"speculative": {"method": "ngram", "num_speculative_tokens": 3, "model": "/m"}},
            "remove speculative.model",
        ),
        ({"speculative": {"method": "ngram", "num_speculative_tokens": 3}}, "needs prompt_lookup_max"),
        (
            {
                "speculative": {
                    "method": "ngram",
                    "num_speculative_tokens": 3,
                    "prompt_lookup_min": 5,
                    "prompt_lookup_max": 2,
                }
            },
            "must not exceed",
        ),
        (
            {
                "speculative": {
                    "method": "eagle3",
                    "model": "/m",
                    "num_speculative_tokens": 3,
                    "prompt_lookup_max": 2,
                }
            },
            "only apply to ngram",
        ),
        ({"speculative": {"method": "ngram", "prompt_lookup_max": 4}}, "num_speculative_tokens"),
        ({"speculative": {"method": "lookahead", "num_speculative_tokens": 2}}, "engine.speculative.method"),
        (ngram(**{SCHEDULE: []}), "at least one"),
        (ngram(**{SCHEDULE: [[2, 8, 4]]}), "must start at batch size 1"),
        (ngram(**{SCHEDULE: [[1, 8, 4], [8, 16, 2]]}), "without overlapping"),
        (ngram(**{SCHEDULE: [[1, 8, 4], [4, 2, 2]]}), "0 < batch_from <= batch_to"),
        (ngram(**{SCHEDULE: [[1, 8, -1]]}), "tokens >= 0"),
        (ngram(**{SCHEDULE: [[1, 8, 6]]}), "more than num_speculative_tokens"),
        (ngram(**{SCHEDULE: [[1, 8]]}), SCHEDULE),
        (
            {"speculative": {"method": "suffix", "num_speculative_tokens": 8, SCHEDULE: [[1, 8, 4]]}},
            "adapts its draft length",
        ),
        (ngram(suffix_decoding_max_tree_depth=8), "only apply to suffix"),
        (
            {
                "speculative": {
                    "method": "suffix",
                    "num_speculative_tokens": 8,
                    "suffix_decoding_min_token_prob": 1.5,
                }
            },
            "suffix_decoding_min_token_prob",
        ),
        ({"max_num_batched_tokens": 32, "max_num_seqs": 64}, "at least max_num_seqs"),
        (
            {"max_num_batched_tokens": 1024, "enable_chunked_prefill": False, "max_model_len": 2048},
            "without chunked prefill",
        ),
        ({"pipeline_parallel_size": 2, "distributed_executor_backend": "uni"}, "runs one worker"),
        (
            {
                "tensor_parallel_size": 4,
                "speculative": {
                    "method": "draft_model",
                    "model": "/d",
                    "num_speculative_tokens": 3,
                    "draft_tensor_parallel_size": 2,
                },
            },
            "draft_tensor_parallel_size",
        ),
        ({"block_size": 24}, "power of two"),
        ({"quantization": "int3"}, "engine.quantization"),
        ({"quantization": "bitsandbytes"}, "not in vLLM 0.32"),
        ({"kv_cache_dtype": "int4"}, "engine.kv_cache_dtype"),
        ({"backend": "transformers", "tensor_parallel_size": 3}, "transformers baseline"),
    ],
)
def test_impossible_combinations_are_config_errors(engine: dict[str, Any], message: str) -> None:
    assert message in config_error(**engine)


def test_model_fit_names_every_mismatch_with_the_models_numbers() -> None:
    config = engine_config(tensor_parallel_size=2, pipeline_parallel_size=40, max_model_len=16384)
    problems = model_fit_problems(config, SMOLLM2)
    assert problems == [
        "tensor_parallel_size 2 does not divide the model's 9 attention heads",
        "tensor_parallel_size 2 and the model's 3 KV heads: one must divide the other",
        "pipeline_parallel_size 40 exceeds the model's 30 layers",
        "max_model_len 16384 exceeds the model's context of 8192 tokens",
    ]


def test_more_ranks_than_kv_heads_is_fine_when_they_replicate_evenly() -> None:
    assert model_fit_problems(engine_config(tensor_parallel_size=16), LLAMA_3_8B) == []
    assert model_fit_problems(engine_config(tensor_parallel_size=12), LLAMA_3_8B) == [
        "tensor_parallel_size 12 does not divide the model's 32 attention heads",
        "tensor_parallel_size 12 and the model's 8 KV heads: one must divide the other",
    ]


def test_awq_needs_an_awq_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_2_7B))
    config = load_config(REPO / "configs" / "gpu-llama2-7b-awq.yaml", {"engine": {"model": str(tmp_path)}})
    with pytest.raises(ModelFitError, match="no quantization_config"):
        check_model_fit(config.engine)


def test_check_config_command_prints_engine_args_and_refuses_a_misfit(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from llmserve.cli import main

    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2))
    assert main(["check-config", "--config", str(REPO / "configs" / "cpu-smollm2-spec-ngram.yaml"),
                 "--model", str(tmp_path)]) == 0  # fmt: skip
    printed = json.loads(capsys.readouterr().out)
    assert printed["vllm_engine_args"]["speculative_config"]["method"] == "ngram"
    assert main(["check-config", "--model", str(tmp_path), "--set", "engine.tensor_parallel_size=2"]) == 2
    assert "does not divide the model's 9 attention heads" in capsys.readouterr().err


def test_overrides_reach_nested_speculative_settings() -> None:
    overrides = parse_overrides(
        [
            "engine.speculative.method=ngram",
            "engine.speculative.num_speculative_tokens=2",
            "engine.speculative.prompt_lookup_max=3",
        ]
    )
    config = load_config(REPO / "configs" / "cpu-smollm2.yaml", overrides).engine
    assert config.speculative is not None
    assert config.speculative.num_speculative_tokens == 2
