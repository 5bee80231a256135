"""The naive baseline: transformers `generate()` with static batching, behind the EngineClient protocol.

How a team serves before adopting vLLM: requests queue while a batch runs; the next batch takes
every waiting request with the same sampling settings, left-pads them to the longest prompt and
decodes until the longest `max_tokens` is reached. Nothing streams (the first token arrives with
the last), nothing joins a running batch, and an aborted request still costs its batch slot.
Used by `make bench` as the measured baseline, and as a fallback where vLLM cannot run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmserve.engine.base import (
    GenerationDelta,
    ModelInfo,
    SamplingDefaults,
    SamplingSpec,
    StepListener,
    TokenizedPrompt,
)
from llmserve.engine.dtype import resolve_dtype
from llmserve.engine.hf_text import HfTextEngine, TextCodec
from llmserve.engine.model_store import check_model_dir
from llmserve.engine_config import EngineConfig
from llmserve.errors import EngineDeadError, EngineRefusedError

logger = logging.getLogger(__name__)

BATCH_WINDOW_S = 0.02
# Sampling settings one `generate()` call applies to the whole batch.
BatchKey = tuple[float, float, int, float, bool, int | None]


@dataclass
class _Pending:
    request_id: str
    token_ids: tuple[int, ...]
    sampling: SamplingSpec
    result: asyncio.Future[GenerationDelta]
    cancelled: bool = False

    @property
    def batch_key(self) -> BatchKey:
        s = self.sampling
        return (s.temperature, s.top_p, s.top_k, s.repetition_penalty, s.ignore_eos, s.seed)


@dataclass
class _Batcher:
    max_batch: int
    queue: deque[_Pending] = field(default_factory=deque)
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)

    def next_batch(self) -> list[_Pending]:
        first = self.queue.popleft()
        batch, deferred = [first], deque[_Pending]()
        while self.queue and len(batch) < self.max_batch:
            pending = self.queue.popleft()
            (batch if pending.batch_key == first.batch_key else deferred).append(pending)
        self.queue.extendleft(reversed(deferred))
        return [p for p in batch if not p.cancelled]


def check_supported(sampling: SamplingSpec) -> None:
    unsupported = {
        "n": sampling.n != 1,
        "logprobs": sampling.logprobs is not None or sampling.prompt_logprobs is not None,
        "response_format": sampling.structured_output is not None,
        "logit_bias": bool(sampling.logit_bias),
        "presence_penalty": sampling.presence_penalty != 0,
        "frequency_penalty": sampling.frequency_penalty != 0,
        "min_p": sampling.min_p != 0,
    }
    for param, used in unsupported.items():
        if used:
            raise EngineRefusedError(f"{param} is not supported by the transformers baseline engine", param)


class TransformersEngine(HfTextEngine):
    """Create with `start_transformers_engine`."""

    def __init__(
        self, model: Any, tokenizer: Any, config: EngineConfig, sampling_defaults: SamplingDefaults
    ) -> None:
        self._model = model
        self._text = TextCodec(tokenizer)
        self._model_info = ModelInfo(
            max_model_len=config.max_model_len, vocab_size=len(tokenizer), sampling_defaults=sampling_defaults
        )
        self._batcher = _Batcher(max_batch=config.max_num_seqs)
        self._pad_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        )
        self._eos_id: int | None = tokenizer.eos_token_id
        self._loop_task: asyncio.Task[None] | None = None
        self._failed: BaseException | None = None

    @property
    def model_info(self) -> ModelInfo:
        return self._model_info

    @property
    def is_dead(self) -> bool:
        return self._failed is not None

    def watch_steps(self, listener: StepListener) -> None:
        pass  # static batches, untimed: relayed tokens tell admission how long steps take

    async def generate(
        self, prompt: TokenizedPrompt, sampling: SamplingSpec, request_id: str
    ) -> AsyncGenerator[GenerationDelta, None]:
        check_supported(sampling)
        if self._failed is not None:
            raise EngineDeadError()
        pending = _Pending(request_id, prompt.token_ids, sampling, asyncio.get_running_loop().create_future())
        self._batcher.queue.append(pending)
        self._batcher.wakeup.set()
        if self._loop_task is None:
            self._loop_task = asyncio.create_task(self._run_batches(), name="transformers-batcher")
        try:
            delta = await pending.result
        finally:
            pending.cancelled = True
        yield delta

    async def _run_batches(self) -> None:
        while True:
            await self._batcher.wakeup.wait()
            self._batcher.wakeup.clear()
            # A short window lets requests sent together share a batch (the baseline's best case).
            await asyncio.sleep(BATCH_WINDOW_S)
            while self._batcher.queue:
                batch = self._batcher.next_batch()
                if not batch:
                    continue
                try:
                    outputs = await asyncio.to_thread(self._generate_batch, batch)
                except Exception as exc:
                    logger.exception("baseline batch failed")
                    self._failed = exc
                    for pending in [*batch, *self._batcher.queue]:
                        if not pending.result.done():
                            pending.result.set_exception(EngineDeadError())
                    return
                for pending, delta in zip(batch, outputs, strict=True):
                    if not pending.result.done():
                        pending.result.set_result(delta)

    def _generate_batch(self, batch: list[_Pending]) -> list[GenerationDelta]:
        import torch

        longest = max(len(p.token_ids) for p in batch)
        rows = [[self._pad_id] * (longest - len(p.token_ids)) + list(p.token_ids) for p in batch]
        masks = [[0] * (longest - len(p.token_ids)) + [1] * len(p.token_ids) for p in batch]
        device = self._model.device
        sampling = batch[0].sampling
        max_new = max(p.sampling.max_tokens for p in batch)
        options: dict[str, Any] = {"max_new_tokens": max_new, "pad_token_id": self._pad_id}
        if sampling.ignore_eos:
            options["min_new_tokens"] = max_new
        if sampling.temperature > 0:
            options.update(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p)
            options["top_k"] = sampling.top_k if sampling.top_k > 0 else None
        else:
            options.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if sampling.repetition_penalty != 1.0:
            options["repetition_penalty"] = sampling.repetition_penalty
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        with torch.inference_mode():
            generated = self._model.generate(
                input_ids=torch.tensor(rows, device=device),
                attention_mask=torch.tensor(masks, device=device),
                **options,
            )
        new_tokens = generated[:, longest:].tolist()
        return [self._finish(pending, tokens) for pending, tokens in zip(batch, new_tokens, strict=True)]

    def _finish(self, pending: _Pending, tokens: list[int]) -> GenerationDelta:
        """Cut one row where this request would have stopped on its own."""
        sampling = pending.sampling
        stop_ids = set(sampling.stop_token_ids)
        if self._eos_id is not None and not sampling.ignore_eos:
            stop_ids.add(self._eos_id)
        tokens = tokens[: sampling.max_tokens]
        finish_reason = "length"
        for position, token in enumerate(tokens):
            if token in stop_ids:
                tokens, finish_reason = tokens[:position], "stop"
                break
        text: str = self._text.tokenizer.decode(tokens, skip_special_tokens=True)
        cut = min((i for i in (text.find(stop) for stop in sampling.stop) if i >= 0), default=-1)
        if cut >= 0:
            text, finish_reason = text[:cut], "stop"
        return GenerationDelta(text=text, token_ids=tokens, finish_reason=finish_reason)


def _torch_dtype(config: EngineConfig) -> Any:
    import torch

    return {"auto": torch.float32, "float32": torch.float32, "bfloat16": torch.bfloat16,
            "float16": torch.float16}[resolve_dtype(config)]  # fmt: skip


def load_model(config: EngineConfig) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(config.tokenizer or config.model)
    dtype = _torch_dtype(config)
    if config.load_format == "dummy":
        architecture = AutoConfig.from_pretrained(config.model)
        model = AutoModelForCausalLM.from_config(architecture, torch_dtype=dtype)  # type: ignore[no-untyped-call]
    else:
        model = AutoModelForCausalLM.from_pretrained(config.model, torch_dtype=dtype)
    return model.to(config.device).eval(), tokenizer


def read_sampling_defaults(config: EngineConfig) -> SamplingDefaults:
    """What vLLM reads for `generation_config` (auto, vllm or a directory, then the overrides)."""
    from transformers import GenerationConfig

    values: dict[str, Any] = {}
    if config.generation_config != "vllm":
        source = config.model if config.generation_config == "auto" else Path(config.generation_config)
        with contextlib.suppress(OSError):  # a model without generation_config.json has no defaults
            values = GenerationConfig.from_pretrained(source).to_diff_dict()
    values.update({str(key): value for key, value in config.override_generation_config.items()})
    return SamplingDefaults.from_generation_config(values)


@asynccontextmanager
async def start_transformers_engine(config: EngineConfig) -> AsyncIterator[TransformersEngine]:
    if config.load_format != "dummy":
        check_model_dir(config.model)
    model, tokenizer = await asyncio.to_thread(load_model, config)
    engine = TransformersEngine(model, tokenizer, config, read_sampling_defaults(config))
    try:
        yield engine
    finally:
        if engine._loop_task is not None:
            engine._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await engine._loop_task
