"""The engine section of the config: every serving technique vLLM offers, typed and cross-checked.

Each field maps to one of vLLM's engine arguments in `engine.vllm_engine.build_engine_args`.
The checks here need nothing but the config; `engine.model_fit` adds those that need the
model's own `config.json` (head counts, layers, context length).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Dtype = Literal["auto", "bfloat16", "float16", "float32"]
Quantization = Literal["awq", "awq_marlin", "gptq", "gptq_marlin", "fp8", "compressed-tensors"]
# Methods an ops team may expect that the pinned vLLM (0.32) no longer has, with what to use.
REMOVED_QUANTIZATION = {
    "bitsandbytes": "bitsandbytes (NF4/INT8 on load) is not in vLLM 0.32, the pinned engine: "
    "serve a 4-bit AWQ/GPTQ checkpoint (configs/gpu-llama2-7b-awq.yaml) or an INT8 W8A8 one "
    "(configs/gpu-llama3-8b-int8-w8a8.yaml)",
}
KvCacheDtype = Literal["auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"]
SpeculativeMethod = Literal["ngram", "suffix", "draft_model", "eagle", "eagle3", "medusa", "mtp"]
ExecutorBackend = Literal["mp", "ray", "uni"]
LoadFormat = Literal["auto", "safetensors", "dummy"]
SimulatedGpuName = Literal["H200", "H100", "A100-80GB", "L4"]  # engine/step_time.py:GPUS
# The generation-config keys vLLM turns into request defaults (ModelConfig.get_diff_sampling_param).
GenerationDefaultKey = Literal[
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "max_new_tokens",
]

# [batch_from, batch_to, tokens]: a range of batch sizes and the tokens drafted there.
BatchSchedule = tuple[int, int, int]

# Methods whose proposer is a separate set of weights, named by `speculative.model`.
SPECULATIVE_METHODS_WITH_MODEL = frozenset({"draft_model", "eagle", "eagle3", "medusa"})


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SpeculativeConfig(_Section):
    """Speculative decoding: a cheap proposer drafts tokens, the model verifies them in one step.

    Lossless: the target model decides every emitted token (greedy output is unchanged)."""

    method: SpeculativeMethod
    num_speculative_tokens: int = Field(ge=1, le=16, description="Tokens drafted per step.")
    model: str | None = Field(
        default=None, description="Draft model / EAGLE / Medusa head directory (not for ngram, mtp)."
    )
    prompt_lookup_min: int | None = Field(default=None, ge=1, description="ngram: shortest match.")
    prompt_lookup_max: int | None = Field(default=None, ge=1, description="ngram: longest match.")
    draft_tensor_parallel_size: int | None = Field(default=None, ge=1)
    suffix_decoding_max_tree_depth: int | None = Field(
        default=None, ge=1, description="suffix: depth of the prompt and response trees (vLLM: 24)."
    )
    suffix_decoding_max_cached_requests: int | None = Field(
        default=None, ge=0, description="suffix: earlier responses kept to draft from (0: prompt only)."
    )
    suffix_decoding_max_spec_factor: float | None = Field(
        default=None, ge=0, description="suffix: draft at most factor x matched length tokens."
    )
    suffix_decoding_min_token_prob: float | None = Field(
        default=None, ge=0, le=1, description="suffix: draft only tokens at least this likely."
    )
    num_speculative_tokens_per_batch_size: list[BatchSchedule] | None = Field(
        default=None,
        description="[batch_from, batch_to, tokens] ranges: how many tokens to draft at each batch "
        "size, 0 to stop speculating (vLLM's dynamic speculative decoding; ranges start at 1, "
        "ascending, not overlapping; batch sizes past the last keep its value).",
    )

    @field_validator("num_speculative_tokens_per_batch_size")
    @classmethod
    def _schedule_covers_batches_from_1_in_order(cls, value: list[BatchSchedule] | None) -> object:
        if value is None:
            return value
        if not value:
            raise ValueError("the schedule needs at least one [batch_from, batch_to, tokens] range")
        previous_end = 0
        for start, end, tokens in value:
            if not 0 < start <= end or tokens < 0:
                raise ValueError(f"[{start}, {end}, {tokens}]: 0 < batch_from <= batch_to, tokens >= 0")
            if start <= previous_end:
                raise ValueError("ranges must ascend without overlapping")
            previous_end = end
        if value[0][0] != 1:
            raise ValueError("the first range must start at batch size 1")
        return value

    @model_validator(mode="after")
    def _method_matches_its_inputs(self) -> Self:
        if self.method in SPECULATIVE_METHODS_WITH_MODEL and not self.model:
            raise ValueError(f"speculative method {self.method} needs speculative.model (its weights)")
        if self.method == "ngram":
            if self.model:
                raise ValueError("speculative method ngram drafts from the prompt: remove speculative.model")
            if self.prompt_lookup_max is None:
                raise ValueError("speculative method ngram needs prompt_lookup_max (e.g. 4)")
            if self.prompt_lookup_min is not None and self.prompt_lookup_min > self.prompt_lookup_max:
                raise ValueError("speculative.prompt_lookup_min must not exceed prompt_lookup_max")
        elif self.prompt_lookup_min is not None or self.prompt_lookup_max is not None:
            raise ValueError(f"prompt_lookup_min/max only apply to ngram, not {self.method}")
        suffix_keys = [key for key in type(self).model_fields if key.startswith("suffix_decoding_")]
        if self.method != "suffix" and any(getattr(self, key) is not None for key in suffix_keys):
            raise ValueError(f"suffix_decoding_* only apply to suffix, not {self.method}")
        if self.method == "suffix" and self.num_speculative_tokens_per_batch_size is not None:
            # vLLM's suffix proposer asserts every step drafts num_speculative_tokens; it already
            # sizes each request's draft by how well the tree matches.
            raise ValueError(
                "suffix decoding adapts its draft length per request itself: remove "
                "num_speculative_tokens_per_batch_size (vLLM's suffix proposer does not support it)"
            )
        for _, _, tokens in self.num_speculative_tokens_per_batch_size or []:
            if tokens > self.num_speculative_tokens:
                raise ValueError(
                    f"the schedule drafts {tokens} tokens, more than num_speculative_tokens "
                    f"({self.num_speculative_tokens})"
                )
        return self


class SimulatedGpuConfig(_Section):
    """A SIMULATION, for measuring the server at GPU rates without a GPU: vLLM runs for real but
    the forward pass is replaced by the time a roofline model of `gpu` gives for each step, and
    token ids are not a model's (docs/simulated-gpu.md). Never the default."""

    gpu: SimulatedGpuName = "H200"
    step_overhead_ms: float = Field(
        default=1.5, ge=0, description="Fixed cost of a step (launches, sampling): an assumption."
    )
    bandwidth_efficiency: float = Field(default=0.8, gt=0, le=1, description="Share of peak HBM bandwidth.")
    compute_efficiency: float = Field(default=0.5, gt=0, le=1, description="Share of peak dense BF16.")
    activation_reserve_gib: float = Field(
        default=2.0, ge=0, description="GPU memory kept from the KV cache for activations."
    )


class EngineConfig(_Section):
    backend: Literal["vllm", "transformers"] = Field(
        default="vllm", description="transformers: the static-batching baseline, for benchmarks only."
    )
    device: Literal["cpu", "cuda"] = "cpu"
    model: Path = Path(".cache/models/SmolLM2-135M-Instruct")
    tokenizer: Path | None = None
    load_format: LoadFormat = Field(
        default="auto", description="dummy: random weights of the model's shape (benchmarks, no weights)."
    )
    dtype: Dtype = "auto"
    quantization: Quantization | None = None
    max_model_len: int = Field(default=2048, ge=16)
    max_num_seqs: int = Field(default=64, ge=1)
    max_num_batched_tokens: int | None = Field(default=None, ge=16)
    enable_chunked_prefill: bool | None = Field(default=None, description="Unset: vLLM's default (on).")
    enforce_eager: bool = True
    enable_prefix_caching: bool = True
    seed: int = 0
    scheduling_policy: Literal["fcfs", "priority"] = Field(
        default="fcfs", description="priority: vLLM schedules by the requests' priority field too."
    )
    stream_interval: int = Field(
        default=1,
        ge=1,
        description="Tokens vLLM gathers before it hands a stream its next delta (the first and the "
        "last go at once): above 1, less work per streamed token in the API process, coarser streams.",
    )
    generation_config: str = Field(
        default="auto",
        min_length=1,
        description="Defaults for sampling fields a request omits: auto = the model's "
        "generation_config.json (as vLLM does), vllm = OpenAI's neutral defaults, or a directory "
        "holding a generation_config.json.",
    )
    override_generation_config: dict[GenerationDefaultKey, float] = Field(
        default_factory=dict, description="Server-wide defaults that win over generation_config's."
    )
    # Parallelism
    tensor_parallel_size: int = Field(default=1, ge=1)
    pipeline_parallel_size: int = Field(default=1, ge=1)
    data_parallel_size: int = Field(default=1, ge=1)
    distributed_executor_backend: ExecutorBackend | None = Field(
        default=None, description="Unset: mp on one node; ray for more than one node."
    )
    # KV cache
    kv_cache_dtype: KvCacheDtype = "auto"
    block_size: int | None = Field(default=None, ge=1, le=256, description="Tokens per KV block.")
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    kv_cache_memory_gib: float | None = Field(
        default=None, gt=0, description="Fixed KV cache size; on CPU this replaces VLLM_CPU_KVCACHE_SPACE."
    )
    kv_offloading_size_gib: float | None = Field(
        default=None, gt=0, description="Host memory that evicted KV blocks spill to (vLLM V1's swap)."
    )
    speculative: SpeculativeConfig | None = None
    simulated_gpu: SimulatedGpuConfig | None = Field(
        default=None, description="A SIMULATION: vLLM with the forward pass replaced by a GPU's step time."
    )
    cpu_omp_threads_bind: str = Field(
        default="auto", min_length=1, description="VLLM_CPU_OMP_THREADS_BIND: cores for model threads."
    )

    @field_validator("model", "tokenizer")
    @classmethod
    def _expand_user(cls, value: Path | None) -> Path | None:
        return value.expanduser() if value is not None else None

    @field_validator("quantization", mode="before")
    @classmethod
    def _quantization_is_offered(cls, value: object) -> object:
        if isinstance(value, str) and value in REMOVED_QUANTIZATION:
            raise ValueError(REMOVED_QUANTIZATION[value])
        return value

    @field_validator("block_size")
    @classmethod
    def _block_size_is_a_power_of_two(cls, value: int | None) -> int | None:
        if value is not None and value & (value - 1):
            raise ValueError("block_size must be a power of two (8, 16, 32, ...)")
        return value

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @model_validator(mode="after")
    def _combination_is_possible(self) -> Self:
        for problem in _impossible_combinations(self):
            raise ValueError(problem)
        return self


def _impossible_combinations(config: EngineConfig) -> list[str]:
    problems: list[str] = []
    batched = config.max_num_batched_tokens
    if batched is not None and batched < config.max_num_seqs:
        problems.append(
            f"max_num_batched_tokens ({batched}) must be at least max_num_seqs ({config.max_num_seqs})"
        )
    if batched is not None and config.enable_chunked_prefill is False and batched < config.max_model_len:
        problems.append(
            f"without chunked prefill a whole prompt is one step: max_num_batched_tokens ({batched}) "
            f"must be at least max_model_len ({config.max_model_len})"
        )
    if config.distributed_executor_backend == "uni" and config.world_size > 1:
        problems.append(
            "distributed_executor_backend uni runs one worker: tensor/pipeline parallel need mp or ray"
        )
    spec = config.speculative
    if spec is not None and spec.draft_tensor_parallel_size not in (None, 1, config.tensor_parallel_size):
        problems.append(
            "speculative.draft_tensor_parallel_size must be 1 or the model's tensor_parallel_size"
        )
    simulated = config.simulated_gpu is not None
    if simulated and (config.speculative is not None or config.world_size > 1 or config.quantization):
        problems.append(
            "simulated_gpu models one GPU running an unquantized model: no speculation, "
            "parallelism or quantization"
        )
    if simulated and (config.backend != "vllm" or config.distributed_executor_backend is not None):
        problems.append("simulated_gpu is vLLM's executor: backend vllm, distributed_executor_backend unset")
    baseline_extras = config.speculative is not None or config.world_size > 1 or config.quantization
    if config.backend == "transformers" and baseline_extras:
        problems.append(
            "the transformers baseline runs one unquantized model on one device: "
            "no speculation, parallelism or quantization"
        )
    return problems
