"""vLLM's AsyncLLM behind the EngineClient protocol. The only module that imports vllm."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing, asynccontextmanager
from typing import TYPE_CHECKING, Any

from llmserve.engine import process_group
from llmserve.engine.base import (
    GenerationDelta,
    ModelInfo,
    PositionLogprobs,
    SamplingDefaults,
    SamplingSpec,
    StepListener,
    TokenizedPrompt,
    TokenLogprob,
    TokenTiming,
)
from llmserve.engine.dtype import resolve_dtype
from llmserve.engine.hf_text import HfTextEngine, TextCodec
from llmserve.engine.model_fit import check_model_fit
from llmserve.engine.model_store import check_model_dir
from llmserve.engine.step_stats import StatLoggers, StepTimes
from llmserve.engine.step_time import CONFIG_KEY, EXECUTOR_CLASS
from llmserve.engine_config import EngineConfig, SpeculativeConfig
from llmserve.errors import EngineDeadError, EngineFailedError, EngineRefusedError

if TYPE_CHECKING:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine.async_llm import AsyncLLM

logger = logging.getLogger(__name__)

GIB = 1 << 30
# How long vLLM's engine core gets to stop before it is killed. vLLM's default, 5 s, is also how
# long the engine core itself waits for its worker (VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS), so on a
# slow host the engine core was killed while its worker was still exiting, and the interpreter's
# resource tracker found their shared memory and semaphore to clean up. This covers the engine
# core's whole sequence: 5 s for the worker, then SIGTERM and 4 s, then SIGKILL.
ENGINE_STOP_TIMEOUT_S = 15.0


def engine_arguments(config: EngineConfig, served_model_name: str) -> dict[str, Any]:
    """The one place where our engine config becomes vLLM's engine arguments (as keywords)."""
    simulated = config.simulated_gpu
    return {
        "model": str(config.model),
        "tokenizer": str(config.tokenizer) if config.tokenizer else None,
        "served_model_name": [served_model_name],
        "load_format": config.load_format,
        "dtype": resolve_dtype(config),
        "quantization": config.quantization,
        "max_model_len": config.max_model_len,
        "max_num_seqs": config.max_num_seqs,
        "max_num_batched_tokens": config.max_num_batched_tokens,
        "enable_chunked_prefill": config.enable_chunked_prefill,
        "enforce_eager": config.enforce_eager,
        "enable_prefix_caching": config.enable_prefix_caching,
        "seed": config.seed,
        "scheduling_policy": config.scheduling_policy,
        "stream_interval": config.stream_interval,
        "generation_config": config.generation_config,
        "override_generation_config": dict(config.override_generation_config),
        "tensor_parallel_size": config.tensor_parallel_size,
        "pipeline_parallel_size": config.pipeline_parallel_size,
        "data_parallel_size": config.data_parallel_size,
        "distributed_executor_backend": EXECUTOR_CLASS if simulated else config.distributed_executor_backend,
        "additional_config": {CONFIG_KEY: simulated.model_dump()} if simulated else {},
        "kv_cache_dtype": config.kv_cache_dtype,
        "block_size": config.block_size,
        "gpu_memory_utilization": config.gpu_memory_utilization,
        "kv_cache_memory_bytes": _gib_to_bytes(config.kv_cache_memory_gib),
        "kv_offloading_size": config.kv_offloading_size_gib,
        "speculative_config": _speculative_arguments(config.speculative),
        "disable_log_stats": False,
        "enable_log_requests": False,
    }


def _gib_to_bytes(gib: float | None) -> int | None:
    return int(gib * GIB) if gib is not None else None


def _speculative_arguments(spec: SpeculativeConfig | None) -> dict[str, Any] | None:
    if spec is None:
        return None
    return spec.model_dump(exclude_none=True)


def build_engine_args(config: EngineConfig, served_model_name: str) -> AsyncEngineArgs:
    from vllm.engine.arg_utils import AsyncEngineArgs

    return AsyncEngineArgs(**engine_arguments(config, served_model_name))


def apply_process_environment(config: EngineConfig) -> None:
    """vLLM reads these from the environment of the processes it spawns; set before start-up."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu" if config.device == "cpu" else "cuda")
    if config.device == "cpu":
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = config.cpu_omp_threads_bind


def to_sampling_params(spec: SamplingSpec) -> SamplingParams:
    from vllm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams

    structured = None
    if spec.structured_output is not None:
        structured = StructuredOutputsParams(
            json=spec.structured_output.json_schema,
            json_object=spec.structured_output.json_object or None,
        )
    return SamplingParams(
        n=spec.n,
        max_tokens=spec.max_tokens,
        temperature=spec.temperature,
        top_p=spec.top_p,
        top_k=spec.top_k,
        min_p=spec.min_p,
        presence_penalty=spec.presence_penalty,
        frequency_penalty=spec.frequency_penalty,
        repetition_penalty=spec.repetition_penalty,
        seed=spec.seed,
        stop=list(spec.stop) or None,
        stop_token_ids=list(spec.stop_token_ids) or None,
        ignore_eos=spec.ignore_eos,
        logprobs=spec.logprobs,
        prompt_logprobs=spec.prompt_logprobs,
        logit_bias=dict(spec.logit_bias) if spec.logit_bias else None,
        structured_outputs=structured,
        # A response that is not streamed takes each choice whole, as vLLM's own server does:
        # no output per token through the output processor and the layers above it.
        output_kind=RequestOutputKind.DELTA if spec.incremental else RequestOutputKind.FINAL_ONLY,
        skip_clone=True,  # made for one request: vLLM need not deep-copy it (its server does alike)
    )


def token_timing(stats: object) -> TokenTiming | None:
    """When the tokens of a choice delivered whole were made, from vLLM's per-request stats (None
    when the engine keeps none): its first token by the front end's clock (arrival + first-token
    latency), its last by the engine core's time from the first."""
    from vllm.v1.metrics.stats import RequestStateStats

    if not isinstance(stats, RequestStateStats) or stats.first_token_ts <= 0:
        return None
    first_ago = max(0.0, time.time() - stats.arrival_time - stats.first_token_latency)
    decode_s = max(0.0, stats.last_token_ts - stats.first_token_ts)
    return TokenTiming(first_token_ago_s=first_ago, last_token_ago_s=max(0.0, first_ago - decode_s))


def _position_logprobs(token_id: int, candidates: Mapping[int, Any], top_n: int) -> PositionLogprobs:
    """One position of vLLM's logprobs (token id -> Logprob) in engine-neutral form."""

    def entry(candidate_id: int, logprob: Any) -> TokenLogprob:
        return TokenLogprob(candidate_id, logprob.decoded_token or "", max(logprob.logprob, -9999.0))

    ranked = sorted(candidates.items(), key=lambda item: -float(item[1].logprob))
    chosen = candidates.get(token_id)
    return PositionLogprobs(
        chosen=entry(token_id, chosen) if chosen is not None else TokenLogprob(token_id, "", -9999.0),
        top=tuple(entry(candidate_id, logprob) for candidate_id, logprob in ranked[:top_n]),
    )


def _convert_logprobs(token_ids: Sequence[int], logprobs: Any, top_n: int) -> list[PositionLogprobs] | None:
    if logprobs is None:
        return None
    return [
        _position_logprobs(token_id, candidates, top_n)
        for token_id, candidates in zip(token_ids, logprobs, strict=False)
    ]


def _convert_prompt_logprobs(
    token_ids: Sequence[int], logprobs: Sequence[Mapping[int, Any] | None] | None, top_n: int
) -> list[PositionLogprobs | None] | None:
    if logprobs is None:
        return None
    return [
        None if candidates is None else _position_logprobs(token_id, candidates, top_n)
        for token_id, candidates in zip(token_ids, logprobs, strict=False)
    ]


class VllmEngine(HfTextEngine):
    """A started AsyncLLM; create it with `start_vllm_engine`."""

    def __init__(self, llm: AsyncLLM, step_times: StepTimes) -> None:
        self._llm_or_none: AsyncLLM | None = llm
        self._step_times = step_times
        tokenizer = llm.get_tokenizer()
        self._text = TextCodec(tokenizer)
        self._model_info = ModelInfo(
            max_model_len=llm.model_config.max_model_len,
            vocab_size=len(tokenizer),
            # vLLM's own reading of generation_config (auto / vllm / a directory, with overrides).
            sampling_defaults=SamplingDefaults.from_generation_config(
                llm.model_config.get_diff_sampling_param()
            ),
            kv_cache_tokens=_kv_cache_tokens(llm),
        )
        self._priority_scheduling = llm.vllm_config.scheduler_config.policy == "priority"

    @property
    def _llm(self) -> AsyncLLM:
        if self._llm_or_none is None:
            raise EngineDeadError()
        return self._llm_or_none

    def release(self) -> None:
        """Forget the AsyncLLM so it can be collected right after shutdown."""
        self._llm_or_none = None

    @property
    def model_info(self) -> ModelInfo:
        return self._model_info

    @property
    def is_dead(self) -> bool:
        return self._llm_or_none is None or bool(self._llm_or_none.errored)

    def watch_steps(self, listener: StepListener) -> None:
        self._step_times.listener = listener

    async def generate(
        self, prompt: TokenizedPrompt, sampling: SamplingSpec, request_id: str
    ) -> AsyncGenerator[GenerationDelta, None]:
        from vllm.exceptions import VLLMClientError
        from vllm.inputs.engine import tokens_input
        from vllm.v1.engine.exceptions import EngineDeadError as VllmEngineDeadError

        # Already tokenized, so handed over rendered: vLLM processes it inline, not on its thread pool.
        engine_prompt = tokens_input(list(prompt.token_ids), prompt=prompt.text)
        finished = False
        try:
            params = to_sampling_params(sampling)
            top_n = sampling.logprobs or 0
            prompt_logprobs_pending = sampling.prompt_logprobs is not None
            priority = sampling.priority if self._priority_scheduling else 0
            generation = self._llm.generate(engine_prompt, params, request_id, priority=priority)
            async with aclosing(generation) as outputs:
                async for output in outputs:
                    finished = output.finished
                    for completion in output.outputs:
                        delta = GenerationDelta(
                            text=completion.text,
                            token_ids=completion.token_ids,
                            finish_reason=completion.finish_reason,
                            index=completion.index,
                            logprobs=_convert_logprobs(completion.token_ids, completion.logprobs, top_n),
                            timing=None if sampling.incremental else token_timing(output.metrics),
                        )
                        if prompt_logprobs_pending and output.prompt_logprobs is not None:
                            delta.prompt_logprobs = _convert_prompt_logprobs(
                                prompt.token_ids, output.prompt_logprobs, sampling.prompt_logprobs or 0
                            )
                            prompt_logprobs_pending = False
                        yield delta
        except VllmEngineDeadError as exc:
            finished = True
            raise EngineDeadError() from exc
        except (VLLMClientError, ValueError) as exc:
            raise EngineRefusedError(str(exc)) from exc
        except (asyncio.CancelledError, GeneratorExit):
            raise
        except Exception as exc:
            raise EngineFailedError(f"request {request_id} failed to generate") from exc
        finally:
            if not finished and not self.is_dead:
                await self._llm.abort(request_id)


def _kv_cache_tokens(llm: AsyncLLM) -> int | None:
    """Tokens the KV cache holds, as the engine core reported at start-up."""
    cache = llm.vllm_config.cache_config
    blocks, block_size = cache.num_gpu_blocks, cache.block_size
    return int(blocks * block_size) if blocks and block_size else None


def import_async_llm() -> type[AsyncLLM]:
    from vllm.v1.engine.async_llm import AsyncLLM

    return AsyncLLM


def prepare_engine_start(config: EngineConfig) -> None:
    """Before vLLM starts an engine core: the model is there and fits, the environment vLLM's
    processes read is set, and they are spawned through the process-group launcher."""
    check_model_dir(config.model)
    check_model_fit(config)
    apply_process_environment(config)
    process_group.use_launcher()


@asynccontextmanager
async def run_async_llm(
    build: Callable[[type[AsyncLLM], StatLoggers], AsyncLLM],
) -> AsyncIterator[VllmEngine]:
    """An AsyncLLM made by `build` (given the class and the stat loggers to pass it) behind the
    EngineClient protocol; shut down on exit.

    Importing vLLM and building the engine take ~45 s of blocking work: keep it off the event
    loop so /health answers during start-up. AsyncLLM starts its loop tasks on first use. The
    thread that spawns the engine core lives as long as the engine: the kernel's parent-death
    signal (engine/process_group.py) follows the spawning thread, not the process."""
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="llmserve-engine") as engine_thread:
        # Imported in a call of its own: some module vLLM imports keeps a frame alive, and every
        # frame it chains back to would keep the AsyncLLM alive until interpreter exit, where its
        # __del__ fails on torn-down modules.
        async_llm = await loop.run_in_executor(engine_thread, import_async_llm)
        step_times = StepTimes()
        stat_loggers = [step_times.stat_logger_factory()]
        llm = await loop.run_in_executor(engine_thread, build, async_llm, stat_loggers)
        engine = VllmEngine(llm, step_times)
        try:
            yield engine
        finally:
            engine.release()
            llm.shutdown(timeout=ENGINE_STOP_TIMEOUT_S)
            # AsyncLLM.__del__ shuts down again; let it run now rather than at interpreter exit,
            # when the modules it calls are already torn down.
            del llm
            gc.collect()


@asynccontextmanager
async def start_vllm_engine(config: EngineConfig, served_model_name: str) -> AsyncIterator[VllmEngine]:
    """Start AsyncLLM (spawning its engine-core process) and shut it down on exit."""
    prepare_engine_start(config)
    engine_args = build_engine_args(config, served_model_name)

    def build(async_llm: type[AsyncLLM], stat_loggers: StatLoggers) -> AsyncLLM:
        return async_llm.from_engine_args(engine_args, stat_loggers=stat_loggers)

    async with run_async_llm(build) as engine:
        yield engine
