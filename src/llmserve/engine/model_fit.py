"""Checks of the engine config against the model's own `config.json`, before vLLM starts.

vLLM finds these too, but only after loading for tens of seconds, and in words about ranks and
shards; an ops team wants "tensor_parallel_size 3 does not divide the 32 attention heads".
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from llmserve.engine_config import EngineConfig

# Methods that read a pre-quantized checkpoint (fp8 alone also quantizes bf16 weights on load).
CHECKPOINT_QUANTIZATION = frozenset({"awq", "awq_marlin", "gptq", "gptq_marlin", "compressed-tensors"})


class ModelFitError(Exception):
    """The engine config cannot serve this model."""


def read_model_architecture(model_dir: Path) -> dict[str, Any] | None:
    """The model's Hugging Face config.json, or None when the directory has none (yet)."""
    path = model_dir / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ModelFitError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelFitError(f"{path} is not a JSON object")
    text_config = data.get("text_config")
    return {**data, **text_config} if isinstance(text_config, dict) else data


def model_fit_problems(config: EngineConfig, architecture: Mapping[str, Any]) -> list[str]:
    problems: list[str] = []
    tp = config.tensor_parallel_size
    heads = architecture.get("num_attention_heads")
    kv_heads = architecture.get("num_key_value_heads", heads)
    layers = architecture.get("num_hidden_layers")
    max_positions = architecture.get("max_position_embeddings")
    if isinstance(heads, int) and heads % tp:
        problems.append(f"tensor_parallel_size {tp} does not divide the model's {heads} attention heads")
    # Fewer KV heads than ranks is fine when each KV head is replicated an equal number of times.
    if isinstance(kv_heads, int) and kv_heads % tp and tp % kv_heads:
        problems.append(
            f"tensor_parallel_size {tp} and the model's {kv_heads} KV heads: one must divide the other"
        )
    if isinstance(layers, int) and config.pipeline_parallel_size > layers:
        problems.append(
            f"pipeline_parallel_size {config.pipeline_parallel_size} exceeds the model's {layers} layers"
        )
    if isinstance(max_positions, int) and config.max_model_len > max_positions:
        problems.append(
            f"max_model_len {config.max_model_len} exceeds the model's context of {max_positions} tokens"
        )
    quantized_as = (architecture.get("quantization_config") or {}).get("quant_method")
    if config.quantization in CHECKPOINT_QUANTIZATION and quantized_as is None:
        problems.append(
            f"quantization {config.quantization} needs a checkpoint quantized with it; "
            "this model's config.json has no quantization_config"
        )
    return problems


def check_model_fit(config: EngineConfig) -> None:
    """Raise ModelFitError naming every mismatch; a model without config.json is not checked here."""
    if config.speculative is not None and config.speculative.method == "suffix":
        check_suffix_decoding_installed()
    architecture = read_model_architecture(config.model)
    if architecture is None:
        return
    problems = model_fit_problems(config, architecture)
    if problems:
        raise ModelFitError(f"engine config does not fit the model at {config.model}: " + "; ".join(problems))


def check_suffix_decoding_installed() -> None:
    if importlib.util.find_spec("arctic_inference") is None:
        raise ModelFitError(
            "speculative method suffix needs Snowflake's arctic-inference package, which is not "
            "installed: `make venv` (scripts/setup-venv.sh) builds it against the venv's torch"
        )
