"""A SIMULATED GPU: vLLM's own executor interface with the model's forward pass replaced by a wait.

Everything else is vLLM's and runs for real: the scheduler (continuous batching, chunked prefill,
preemption), the paged KV cache manager and prefix cache, the engine core's ZMQ loop, AsyncLLM,
the output processor and detokenizer in the API process. Only `execute_model` differs: it waits
for the time a named GPU would take for the scheduled batch (`StepTimeModel`, constants with their
sources in engine/step_time.py) and returns token ids that are not a model's (ids from the middle of the
vocabulary, never a special token), one per request whose prompt is done, as vLLM's GPU model
runner does. It answers the question the mission asks of the front end: with an engine that runs
at a GPU's speed, what rate does the server hold at p99 < 200 ms?

Used through vLLM's `distributed_executor_backend` (a class path, resolved in the engine core
process) with its settings in `additional_config`; never the default (`engine.simulated_gpu`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import numpy as np
from vllm.v1.executor.abstract import Executor

from llmserve.engine.step_time import (
    GIB,
    GPUS,
    ModelShape,
    SimulatedTokens,
    StepTimeModel,
    sampled_tokens,
    simulation_settings,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec
    from vllm.v1.outputs import ModelRunnerOutput

logger = logging.getLogger(__name__)


def _done(value: Any) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_result(value)
    return future


class SimulatedGpuExecutor(Executor):
    """vLLM's executor interface with a step-time model for a forward pass (see the module)."""

    uses_ray = False
    supports_pp = False

    def _init_executor(self) -> None:
        import torch
        from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE

        config: VllmConfig = self.vllm_config
        self.settings = simulation_settings(config.additional_config)
        # A GPU serves in BF16 whatever dtype this CPU's vLLM picked (float32 where it has no BF16).
        cache_dtype = config.cache_config.cache_dtype
        self.kv_dtype = torch.bfloat16 if cache_dtype == "auto" else STR_DTYPE_TO_TORCH_DTYPE[cache_dtype]
        hf_config = config.model_config.hf_text_config
        shape = ModelShape.from_hf_config(hf_config, torch.bfloat16.itemsize, self.kv_dtype.itemsize)
        self.shape = shape
        self.step_time = StepTimeModel(
            gpu=GPUS[self.settings.gpu],
            model=shape,
            overhead_s=self.settings.step_overhead_ms / 1000,
            bandwidth_efficiency=self.settings.bandwidth_efficiency,
            compute_efficiency=self.settings.compute_efficiency,
        )
        self.tokens = SimulatedTokens(shape.vocab)
        self.prompt_lengths: dict[str, int] = {}
        self.num_logprobs: dict[str, int] = {}
        self.pending: ModelRunnerOutput | None = None
        logger.warning(
            "SIMULATED GPU (%s): no forward pass runs; steps take the time of a roofline model "
            "(%.2f GB of weights, %d KV bytes per token) and token ids are not a model's",
            self.step_time.gpu.name,
            shape.weight_bytes / 1e9,
            shape.kv_bytes_per_token,
        )

    # Start-up: what a worker reports, from the model's shape and the named GPU.
    def get_kv_cache_specs(self) -> list[dict[str, KVCacheSpec]]:
        from vllm.v1.kv_cache_interface import FullAttentionSpec

        spec = FullAttentionSpec(
            block_size=self.vllm_config.cache_config.block_size,
            num_kv_heads=self.shape.kv_heads,
            head_size=self.shape.head_dim,
            dtype=self.kv_dtype,
        )
        return [{f"model.layers.{layer}.self_attn.attn": spec for layer in range(self.shape.layers)}]

    def determine_available_memory(self) -> list[int]:
        cache = self.vllm_config.cache_config
        if cache.kv_cache_memory_bytes:
            return [int(cache.kv_cache_memory_bytes)]
        usable = self.step_time.gpu.memory_bytes * cache.gpu_memory_utilization
        reserve = self.settings.activation_reserve_gib * GIB
        return [int(usable - self.shape.weight_bytes - reserve)]

    def get_supported_kv_cache_layouts(self) -> list[list[str]]:
        return [["LBNHC"]]

    def set_kv_cache_layout(self, layout_name: str) -> None:
        from vllm.v1.attention.backends.utils import record_kv_cache_layout

        record_kv_cache_layout(self.vllm_config.cache_config, layout_name)

    def initialize_from_config(self, kv_cache_configs: list[KVCacheConfig]) -> None:
        logger.info("simulated GPU: %d KV blocks (no memory allocated)", kv_cache_configs[0].num_blocks)

    def compile_or_warm_up_model(self) -> None:
        return None

    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        timeout: float | None = None,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        non_block: bool = False,
    ) -> Any:
        result: list[Any] = [("generate",)] if method == "get_supported_tasks" else [None]
        return _done(result) if non_block else result

    # Steps.
    def execute_model(self, scheduler_output: SchedulerOutput, non_block: bool = False) -> Any:
        from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT

        started = time.perf_counter()
        for new in scheduler_output.scheduled_new_reqs:
            params = new.sampling_params
            if params is not None and params.logprobs is not None:
                self.num_logprobs[new.req_id] = max(0, params.logprobs)
        for request_id in scheduler_output.finished_req_ids:
            self.num_logprobs.pop(request_id, None)
        sampled, batch = sampled_tokens(scheduler_output, self.prompt_lengths, self.tokens)
        result: ModelRunnerOutput | None = None
        if scheduler_output.total_num_scheduled_tokens == 0:
            result = EMPTY_MODEL_RUNNER_OUTPUT
        else:
            self.pending = self._runner_output(sampled)
            remaining = self.step_time.step_seconds(batch) - (time.perf_counter() - started)
            if remaining > 0:
                time.sleep(remaining)
        return _done(result) if non_block else result

    def sample_tokens(self, grammar_output: GrammarOutput | None, non_block: bool = False) -> Any:
        output, self.pending = self.pending, None
        return _done(output) if non_block else output

    def _runner_output(self, sampled: dict[str, list[int]]) -> ModelRunnerOutput:
        from vllm.v1.outputs import ModelRunnerOutput

        request_ids = list(sampled)
        return ModelRunnerOutput(
            req_ids=request_ids,
            req_id_to_index={request_id: index for index, request_id in enumerate(request_ids)},
            sampled_token_ids=list(sampled.values()),
            logprobs=self._logprobs(sampled),
        )

    def _logprobs(self, sampled: dict[str, list[int]]) -> Any:
        """Logprobs for the requests that asked (the sampled token first, at rank 1)."""
        wanted = [self.num_logprobs.get(request_id) for request_id in sampled]
        if all(count is None for count in wanted):
            return None
        from vllm.v1.outputs import LogprobsLists

        width = 1 + max(count or 0 for count in wanted)
        token_ids = np.zeros((len(sampled), width), dtype=np.int32)
        for row, tokens in enumerate(sampled.values()):
            first = tokens[0] if tokens else 0
            token_ids[row] = [first + offset for offset in range(width)]
        logprobs = np.tile(-np.arange(1, width + 1, dtype=np.float32) / 2, (len(sampled), 1))
        ranks = np.ones(len(sampled), dtype=np.int32)
        return LogprobsLists(token_ids, logprobs, ranks)

    def take_draft_token_ids(self) -> None:
        return None

    def check_health(self) -> None:
        return None

    def shutdown(self) -> None:
        return None
