"""What both endpoints do with the engine: fit requests into the context, run them, count usage."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from llmserve.engine.base import (
    EngineClient,
    GenerationDelta,
    InvalidRequestError,
    ModelInfo,
    PositionLogprobs,
    PromptTooLongError,
    SamplingSpec,
    TokenizedPrompt,
)
from llmserve.protocol.common import UsageInfo
from llmserve.serving.streaming import merge_async_iterators


class GenerationObserver(Protocol):
    """Told about prompt and generated tokens as they happen (the metrics layer implements it)."""

    def on_prompt(self, prompt_tokens: int) -> None: ...

    def on_tokens(self, choice: int, count: int) -> None: ...


class NoObserver:
    def on_prompt(self, prompt_tokens: int) -> None:
        pass

    def on_tokens(self, choice: int, count: int) -> None:
        pass


class GenerationService:
    """What every endpoint's service holds: the engine, the public model name, an observer."""

    def __init__(
        self,
        engine: EngineClient,
        served_model_name: str,
        observer: GenerationObserver | None = None,
        max_prompt_tokens: int | None = None,
    ) -> None:
        self._engine = engine
        self._model_name = served_model_name
        self._observer = observer or NoObserver()
        self._max_prompt_tokens = max_prompt_tokens


@dataclass(frozen=True, slots=True)
class PlannedPrompt:
    prompt: TokenizedPrompt
    sampling: SamplingSpec


def engine_sequences(planned: Sequence[PlannedPrompt]) -> int:
    return sum(item.sampling.n for item in planned)


def prompt_tokens(planned: Sequence[PlannedPrompt]) -> int:
    return sum(len(item.prompt.token_ids) for item in planned)


def max_new_tokens(planned: Sequence[PlannedPrompt]) -> int:
    return sum(item.sampling.max_tokens * item.sampling.n for item in planned)


class PromptOverLimitError(InvalidRequestError):
    def __init__(self, prompt_len: int, limit: int, param: str) -> None:
        super().__init__(
            f"The prompt has {prompt_len} tokens; this server accepts at most {limit}.", param=param
        )


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
    engine: EngineClient,
    request_id: str,
    planned: Sequence[PlannedPrompt],
    observer: GenerationObserver,
) -> AsyncIterator[tuple[int, GenerationDelta]]:
    """Deltas of every choice as they arrive, as (choice index, delta); choice = prompt * n + i."""
    observer.on_prompt(prompt_tokens(planned))
    iterators = [
        engine.generate(item.prompt, item.sampling, f"{request_id}-{position}")
        for position, item in enumerate(planned)
    ]
    async for position, delta in merge_async_iterators(iterators):
        choice = position * planned[position].sampling.n + delta.index
        observer.on_tokens(choice, len(delta.token_ids))
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
    engine: EngineClient,
    request_id: str,
    planned: Sequence[PlannedPrompt],
    observer: GenerationObserver,
) -> list[ChoiceState]:
    choices = [ChoiceState() for item in planned for _ in range(item.sampling.n)]
    async for index, delta in run_generations(engine, request_id, planned, observer):
        choices[index].add(delta)
    return choices


def usage_of(planned: Sequence[PlannedPrompt], completion_tokens: int) -> UsageInfo:
    prompt_count = prompt_tokens(planned)
    return UsageInfo(
        prompt_tokens=prompt_count,
        completion_tokens=completion_tokens,
        total_tokens=prompt_count + completion_tokens,
    )
