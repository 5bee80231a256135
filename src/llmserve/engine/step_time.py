"""The step-time model of the simulated GPU (engine.simulated_gpu): how long a named GPU takes for
one of vLLM's scheduled batches, from datasheet figures and the model's shape, and which requests
sample a token in it. Pure arithmetic, no vLLM import (the executor is engine/simulated_gpu.py).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llmserve.engine_config import SimulatedGpuConfig

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput

CONFIG_KEY = "llmserve_simulated_gpu"
EXECUTOR_CLASS = "llmserve.engine.simulated_gpu.SimulatedGpuExecutor"
GIB = 1024**3


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_bytes: float
    memory_bandwidth: float  # bytes/s
    dense_bf16_flops: float  # FLOP/s, without structured sparsity
    source: str


# Vendor datasheet figures. NVIDIA quotes BF16 Tensor Core throughput "with sparsity"; the dense
# figure used here is half of it.
GPUS: dict[str, GpuSpec] = {
    "H200": GpuSpec(
        "NVIDIA H200 SXM", 141e9, 4.8e12, 989.5e12,
        "NVIDIA H200 Tensor Core GPU datasheet: 141 GB HBM3e, 4.8 TB/s, BF16 1,979 TFLOPS with sparsity",
    ),
    "H100": GpuSpec(
        "NVIDIA H100 SXM", 80e9, 3.35e12, 989.5e12,
        "NVIDIA H100 Tensor Core GPU datasheet: 80 GB HBM3, 3.35 TB/s, BF16 1,979 TFLOPS with sparsity",
    ),
    "A100-80GB": GpuSpec(
        "NVIDIA A100 80GB SXM", 80e9, 2.039e12, 312e12,
        "NVIDIA A100 Tensor Core GPU datasheet: 80 GB HBM2e, 2,039 GB/s, BF16 312 TFLOPS",
    ),
    "L4": GpuSpec(
        "NVIDIA L4", 24e9, 300e9, 121e12,
        "NVIDIA L4 Tensor Core GPU datasheet: 24 GB GDDR6, 300 GB/s, BF16 242 TFLOPS with sparsity",
    ),
}  # fmt: skip


@dataclass(frozen=True)
class ModelShape:
    """What a decoder-only transformer moves and computes per step (Llama-family shapes)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    weight_bytes_per_parameter: int
    kv_bytes_per_element: int

    @property
    def layer_parameters(self) -> int:
        attention = self.hidden * self.heads * self.head_dim * 2  # q and o
        attention += self.hidden * self.kv_heads * self.head_dim * 2  # k and v
        return self.layers * (attention + 3 * self.hidden * self.intermediate)  # gate, up, down

    @property
    def weight_bytes(self) -> int:
        # What a step reads: the layers and the LM head (the embedding lookup reads a few rows).
        return (self.layer_parameters + self.vocab * self.hidden) * self.weight_bytes_per_parameter

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.kv_bytes_per_element

    @classmethod
    def from_hf_config(cls, config: Any, weight_bytes: int, kv_bytes: int) -> ModelShape:
        heads = int(config.num_attention_heads)
        return cls(
            layers=int(config.num_hidden_layers),
            hidden=int(config.hidden_size),
            heads=heads,
            kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
            head_dim=int(getattr(config, "head_dim", None) or config.hidden_size // heads),
            intermediate=int(config.intermediate_size),
            vocab=int(config.vocab_size),
            weight_bytes_per_parameter=weight_bytes,
            kv_bytes_per_element=kv_bytes,
        )


@dataclass(frozen=True)
class RequestStep:
    """One request's share of a step: tokens scheduled now, tokens already in its KV cache."""

    scheduled: int
    cached: int
    samples: bool


@dataclass(frozen=True)
class StepTimeModel:
    """Roofline of one step: the slower of moving the bytes and doing the FLOPs, plus a fixed cost.

    Bytes: every weight once, and each scheduled request's KV cache (what is cached plus what is
    written now). FLOPs: 2 per weight per scheduled token for the layers, the LM head only for
    the tokens sampled, and attention (QK and AV, 4 FLOPs per head dimension per cached token).
    The efficiencies and the per-step overhead (launches, sampling, synchronisation) are
    assumptions of this model, not measurements: see docs/simulated-gpu.md.
    """

    gpu: GpuSpec
    model: ModelShape
    overhead_s: float
    bandwidth_efficiency: float
    compute_efficiency: float

    def step_seconds(self, batch: Sequence[RequestStep]) -> float:
        tokens = sum(request.scheduled for request in batch)
        if tokens == 0:
            return 0.0
        model = self.model
        kv_tokens = sum(request.cached + request.scheduled for request in batch)
        moved = model.weight_bytes + kv_tokens * model.kv_bytes_per_token
        sampled = sum(1 for request in batch if request.samples)
        attended = sum(r.scheduled * (r.cached + (r.scheduled + 1) / 2) for r in batch)
        flops: float = 2 * model.layer_parameters * tokens + 2 * model.vocab * model.hidden * sampled
        flops += 4 * model.layers * model.heads * model.head_dim * attended
        memory_s = moved / (self.gpu.memory_bandwidth * self.bandwidth_efficiency)
        compute_s = flops / (self.gpu.dense_bf16_flops * self.compute_efficiency)
        return self.overhead_s + max(memory_s, compute_s)


def simulation_settings(additional: Mapping[str, Any] | Any) -> SimulatedGpuConfig:
    """The engine section's `simulated_gpu`, as it reaches the engine core in vLLM's
    `additional_config` (validated again there: the same model, the same checks)."""
    settings = additional.get(CONFIG_KEY) if isinstance(additional, Mapping) else None
    if not isinstance(settings, Mapping):
        raise ValueError(f"the simulated GPU executor needs additional_config[{CONFIG_KEY!r}]")
    return SimulatedGpuConfig.model_validate(settings)


class SimulatedTokens:
    """Token ids for the simulation: from the middle of the vocabulary (no special or end token),
    a function of the request and position so a rerun produces the same text."""

    def __init__(self, vocab: int) -> None:
        self.low = vocab // 8
        self.span = max(1, vocab // 2 - self.low)

    def token(self, request_id: str, position: int) -> int:
        return self.low + (zlib.crc32(request_id.encode()) + 7919 * position) % self.span


def sampled_tokens(
    scheduler_output: SchedulerOutput, prompt_lengths: dict[str, int], tokens: SimulatedTokens
) -> tuple[dict[str, list[int]], list[RequestStep]]:
    """Which requests sample a token this step, as vLLM's model runner decides it: those whose
    scheduled tokens reach the end of what they hold (prompt plus outputs so far); a chunk of a
    longer prompt samples nothing. Updates `prompt_lengths` (new requests in, finished ones out)."""
    for request_id in scheduler_output.finished_req_ids:
        prompt_lengths.pop(request_id, None)
    held: dict[str, tuple[int, int]] = {}  # request -> (tokens computed before, outputs so far)
    for new in scheduler_output.scheduled_new_reqs:
        prompt_lengths[new.req_id] = len(new.prompt_token_ids or ())
        held[new.req_id] = (new.num_computed_tokens, 0)
    cached = scheduler_output.scheduled_cached_reqs
    for index, request_id in enumerate(cached.req_ids):
        held[request_id] = (cached.num_computed_tokens[index], cached.num_output_tokens[index])
    sampled: dict[str, list[int]] = {}
    batch: list[RequestStep] = []
    for request_id, scheduled in scheduler_output.num_scheduled_tokens.items():
        computed, outputs = held[request_id]
        total = prompt_lengths.get(request_id, 0) + outputs
        samples = computed + scheduled >= total
        sampled[request_id] = [tokens.token(request_id, computed + scheduled)] if samples else []
        batch.append(RequestStep(scheduled=scheduled, cached=computed, samples=samples))
    return sampled, batch
