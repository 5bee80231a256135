"""/v1/completions: validated request -> engine generations -> one JSON body or an SSE stream."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from llmserve.engine.base import (
    EngineClient,
    GenerationDelta,
    InvalidRequestError,
    PromptTooLongError,
    SamplingSpec,
    TokenizedPrompt,
)
from llmserve.protocol.common import UsageInfo, unix_time
from llmserve.protocol.completions import (
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    CompletionStreamResponse,
)
from llmserve.serving.streaming import DONE_EVENT, merge_async_iterators, sse_event

logger = logging.getLogger(__name__)


class EmptyPromptError(InvalidRequestError):
    def __init__(self) -> None:
        super().__init__("The prompt must contain at least one token.")


class TokenOutOfRangeError(InvalidRequestError):
    def __init__(self, token_id: int, vocab_size: int) -> None:
        super().__init__(f"Token id {token_id} is out of vocabulary (vocab_size={vocab_size}).")


@dataclass(frozen=True, slots=True)
class PlannedCompletion:
    """A request whose prompts are tokenized and checked against the context window."""

    request: CompletionRequest
    request_id: str
    created: int
    prompts: list[TokenizedPrompt]
    samplings: list[SamplingSpec]

    def engine_request_id(self, prompt_index: int) -> str:
        return f"{self.request_id}-{prompt_index}"


class CompletionService:
    def __init__(self, engine: EngineClient, served_model_name: str) -> None:
        self._engine = engine
        self._model_name = served_model_name

    async def plan(self, request: CompletionRequest, request_id: str) -> PlannedCompletion:
        request.reject_unsupported()
        if request.unknown_fields:
            logger.info("request %s: ignoring unknown fields %s", request_id, request.unknown_fields)
        prompts = [await self._tokenize(prompt) for prompt in _split_prompts(request.prompt)]
        max_model_len = self._engine.model_info.max_model_len
        samplings = []
        for prompt in prompts:
            prompt_len = len(prompt.token_ids)
            room = max_model_len - prompt_len
            sampling = request.to_sampling_spec(default_max_tokens=max(room, 1))
            if prompt_len + sampling.max_tokens > max_model_len:
                raise PromptTooLongError(prompt_len, sampling.max_tokens, max_model_len)
            samplings.append(sampling)
        return PlannedCompletion(request, request_id, unix_time(), prompts, samplings)

    async def _tokenize(self, prompt: str | list[int]) -> TokenizedPrompt:
        if isinstance(prompt, str):
            tokenized = await self._engine.tokenize(prompt)
        else:
            vocab_size = self._engine.model_info.vocab_size
            for token_id in prompt:
                if token_id >= vocab_size:
                    raise TokenOutOfRangeError(token_id, vocab_size)
            tokenized = TokenizedPrompt(token_ids=tuple(prompt))
        if not tokenized.token_ids:
            raise EmptyPromptError()
        return tokenized

    def _generations(self, plan: PlannedCompletion) -> list[AsyncIterator[GenerationDelta]]:
        return [
            self._engine.generate(prompt, sampling, plan.engine_request_id(index))
            for index, (prompt, sampling) in enumerate(zip(plan.prompts, plan.samplings, strict=True))
        ]

    async def complete(self, plan: PlannedCompletion) -> CompletionResponse:
        texts = [""] * len(plan.prompts)
        finish_reasons: list[str | None] = [None] * len(plan.prompts)
        completion_tokens = 0
        async for index, delta in merge_async_iterators(self._generations(plan)):
            texts[index] += delta.text
            completion_tokens += len(delta.token_ids)
            if delta.finish_reason is not None:
                finish_reasons[index] = delta.finish_reason
        choices = [
            CompletionChoice(index=i, text=text, finish_reason=reason)
            for i, (text, reason) in enumerate(zip(texts, finish_reasons, strict=True))
        ]
        return CompletionResponse(
            id=plan.request_id,
            created=plan.created,
            model=self._model_name,
            choices=choices,
            usage=_usage(plan.prompts, completion_tokens),
        )

    async def stream(self, plan: PlannedCompletion) -> AsyncIterator[bytes]:
        """SSE chunks: text deltas per choice, a usage chunk if asked for, then [DONE]."""
        completion_tokens = 0
        include_usage = plan.request.include_usage_chunk
        async for index, delta in merge_async_iterators(self._generations(plan)):
            completion_tokens += len(delta.token_ids)
            if not delta.text and delta.finish_reason is None:
                continue
            choice = CompletionChoice(index=index, text=delta.text, finish_reason=delta.finish_reason)
            yield sse_event(self._chunk(plan, [choice]))
        if include_usage:
            yield sse_event(self._chunk(plan, [], usage=_usage(plan.prompts, completion_tokens)))
        yield DONE_EVENT

    def _chunk(
        self,
        plan: PlannedCompletion,
        choices: list[CompletionChoice],
        usage: UsageInfo | None = None,
    ) -> CompletionStreamResponse:
        return CompletionStreamResponse(
            id=plan.request_id,
            created=plan.created,
            model=self._model_name,
            choices=choices,
            usage=usage,
        )


def _split_prompts(prompt: str | list[str] | list[int] | list[list[int]]) -> list[str | list[int]]:
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise EmptyPromptError()
    if all(isinstance(item, int) for item in prompt):
        return [list(prompt)]  # type: ignore[arg-type]
    return list(prompt)  # type: ignore[arg-type]


def _usage(prompts: Sequence[TokenizedPrompt], completion_tokens: int) -> UsageInfo:
    prompt_tokens = sum(len(prompt.token_ids) for prompt in prompts)
    return UsageInfo(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
    )
