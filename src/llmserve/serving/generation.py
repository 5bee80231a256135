"""What both endpoints do with the engine: fit requests into the context, run them, count usage."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from llmserve.engine.base import (
    EngineClient,
    GenerationDelta,
    ModelInfo,
    PositionLogprobs,
    SamplingSpec,
    TokenizedPrompt,
    TokenTiming,
)
from llmserve.errors import PromptOverLimitError, PromptTooLongError
from llmserve.policy.permits import Cost
from llmserve.protocol.common import UsageInfo
from llmserve.serving.streaming import merge_async_iterators


class GenerationObserver(Protocol):
    """Told about prompt and generated tokens as they happen (the request's metrics observation)."""

    def on_prompt(self, prompt_tokens: int) -> None: ...

    def on_tokens(self, choice: int, count: int, timing: TokenTiming | None = None) -> None: ...


@dataclass(frozen=True, slots=True)
class Observers:
    """Both the request's metrics and its permit (which teaches admission the engine's pace)."""

    metrics: GenerationObserver
    permit: GenerationObserver

    def on_prompt(self, prompt_tokens: int) -> None:
        self.metrics.on_prompt(prompt_tokens)
        self.permit.on_prompt(prompt_tokens)

    def on_tokens(self, choice: int, count: int, timing: TokenTiming | None = None) -> None:
        self.metrics.on_tokens(choice, count, timing)
        self.permit.on_tokens(choice, count, timing)


@dataclass(frozen=True, slots=True)
class RequestContext:
    """One request's identity and its observer, for every step of its life."""

    request_id: str
    observer: GenerationObserver


@dataclass(frozen=True, slots=True)
class PlannedPrompt:
    prompt: TokenizedPrompt
    sampling: SamplingSpec


def cost_of(planned: Sequence[PlannedPrompt]) -> Cost:
    """Engine sequences (n per prompt), prompt tokens (once per prompt, as usage counts them, and
    once per sequence, as the KV cache holds them) and the most tokens the request may generate."""
    return Cost(
        sequences=sum(item.sampling.n for item in planned),
        prompt_tokens=prompt_tokens(planned),
        max_new_tokens=sum(item.sampling.max_tokens * item.sampling.n for item in planned),
        kv_prompt_tokens=sum(len(item.prompt.token_ids) * item.sampling.n for item in planned),
    )


def prompt_tokens(planned: Sequence[PlannedPrompt]) -> int:
    return sum(len(item.prompt.token_ids) for item in planned)


def fit_max_tokens(
    prompt_len: int,
    requested: int | None,
    model: ModelInfo,
    param: str,
    max_prompt_tokens: int | None,
) -> int:
    """The completion budget: as requested, else the model's default (generation_config.json's
    max_new_tokens), capped by the rest of the context window, as vLLM does."""
    if max_prompt_tokens is not None and prompt_len > max_prompt_tokens:
        raise PromptOverLimitError(prompt_len, max_prompt_tokens, param)
    if requested is None:
        rest_of_window = max(model.max_model_len - prompt_len, 1)
        default = model.sampling_defaults.max_tokens
        requested = rest_of_window if default is None else min(default, rest_of_window)
    if prompt_len + requested > model.max_model_len:
        raise PromptTooLongError(prompt_len, requested, model.max_model_len, param=param)
    return requested


async def run_generations(
    engine: EngineClient, context: RequestContext, planned: Sequence[PlannedPrompt]
) -> AsyncIterator[tuple[int, GenerationDelta]]:
    """Deltas of every choice as they arrive, as (choice index, delta); choice = prompt * n + i."""
    context.observer.on_prompt(prompt_tokens(planned))
    iterators = [
        engine.generate(item.prompt, item.sampling, f"{context.request_id}-{position}")
        for position, item in enumerate(planned)
    ]
    async for position, delta in merge_async_iterators(iterators):
        choice = position * planned[position].sampling.n + delta.index
        context.observer.on_tokens(choice, len(delta.token_ids), delta.timing)
        yield choice, delta


@dataclass(slots=True)
class ChoiceState:
    """Everything one choice has produced so far."""

    text: str = ""
    token_count: int = 0
    finish_reason: str | None = None
    logprobs: list[PositionLogprobs] = field(default_factory=list)
    prompt_logprobs: list[PositionLogprobs | None] | None = None

    def add(self, delta: GenerationDelta) -> None:
        self.text += delta.text
        self.token_count += len(delta.token_ids)
        if delta.logprobs:
            self.logprobs.extend(delta.logprobs)
        if delta.prompt_logprobs is not None:
            self.prompt_logprobs = delta.prompt_logprobs
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason


async def collect_choices(
    engine: EngineClient, context: RequestContext, planned: Sequence[PlannedPrompt]
) -> list[ChoiceState]:
    choices = [ChoiceState() for item in planned for _ in range(item.sampling.n)]
    async for index, delta in run_generations(engine, context, planned):
        choices[index].add(delta)
    return choices


def usage_of(planned: Sequence[PlannedPrompt], completion_tokens: int) -> UsageInfo:
    prompt_count = prompt_tokens(planned)
    return UsageInfo(
        prompt_tokens=prompt_count,
        completion_tokens=completion_tokens,
        total_tokens=prompt_count + completion_tokens,
    )
