"""/v1/completions: validated request -> engine generations -> one JSON body or an SSE stream."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from llmserve.engine.base import (
    InvalidRequestError,
    PositionLogprobs,
    TokenizedPrompt,
)
from llmserve.protocol.common import UsageInfo, unix_time
from llmserve.protocol.completions import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    CompletionStreamResponse,
    PromptInput,
)
from llmserve.serving.generation import (
    GenerationService,
    PlannedPrompt,
    collect_choices,
    engine_sequences,
    fit_max_tokens,
    max_new_tokens,
    prompt_tokens,
    run_generations,
    usage_of,
)
from llmserve.serving.logprobs import completion_logprobs
from llmserve.serving.streaming import DONE_EVENT, sse_event

logger = logging.getLogger(__name__)


class EmptyPromptError(InvalidRequestError):
    def __init__(self) -> None:
        super().__init__("The prompt must contain at least one token.", param="prompt")


class TokenOutOfRangeError(InvalidRequestError):
    def __init__(self, token_id: int, vocab_size: int) -> None:
        super().__init__(
            f"Token id {token_id} is out of vocabulary (vocab_size={vocab_size}).", param="prompt"
        )


@dataclass(frozen=True, slots=True)
class PlannedCompletion:
    """A request whose prompts are tokenized and checked against the context window."""

    request: CompletionRequest
    request_id: str
    created: int
    prompts: list[PlannedPrompt]
    echo_texts: list[str]

    def prompt_of_choice(self, choice_index: int) -> int:
        return choice_index // self.request.n

    @property
    def engine_sequences(self) -> int:
        return engine_sequences(self.prompts)

    @property
    def prompt_tokens(self) -> int:
        return prompt_tokens(self.prompts)

    @property
    def max_new_tokens(self) -> int:
        return max_new_tokens(self.prompts)


class CompletionService(GenerationService):
    async def plan(self, request: CompletionRequest, request_id: str) -> PlannedCompletion:
        request.reject_unsupported()
        if request.unknown_fields:
            logger.info("request %s: ignoring unknown fields %s", request_id, request.unknown_fields)
        info = self._engine.model_info
        request.check_token_ids(info.vocab_size)
        planned, echo_texts = [], []
        # Scoring a prompt (echo, max_tokens 0) still runs one step: vLLM generates a token at least.
        requested = 1 if request.echo_only else request.requested_max_tokens()
        for prompt_input in _split_prompts(request.prompt):
            prompt = await self._tokenize(prompt_input)
            max_tokens = fit_max_tokens(
                len(prompt.token_ids), requested, info, "prompt", self._max_prompt_tokens
            )
            prompt_logprobs = request.logprobs if request.echo and request.logprobs is not None else None
            sampling = request.to_sampling_spec(
                max_tokens, info.sampling_defaults, prompt_logprobs=prompt_logprobs
            )
            planned.append(PlannedPrompt(prompt, sampling))
            echo_texts.append(await self._prompt_text(prompt) if request.echo else "")
        return PlannedCompletion(request, request_id, unix_time(), planned, echo_texts)

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

    async def _prompt_text(self, prompt: TokenizedPrompt) -> str:
        return prompt.text if prompt.text is not None else await self._engine.detokenize(prompt.token_ids)

    async def complete(self, plan: PlannedCompletion) -> CompletionResponse:
        states = await collect_choices(self._engine, plan.request_id, plan.prompts, self._observer)
        choices = []
        for index, state in enumerate(states):
            prompt_index = plan.prompt_of_choice(index)
            echo = plan.echo_texts[prompt_index]
            generated, positions = ("", []) if plan.request.echo_only else (state.text, state.logprobs)
            logprobs = None
            if plan.request.logprobs is not None:
                logprobs = await self._logprobs(plan, prompt_index, state.prompt_logprobs, positions)
            choices.append(
                CompletionChoice(
                    index=index, text=echo + generated, logprobs=logprobs, finish_reason=state.finish_reason
                )
            )
        completion_tokens = sum(state.token_count for state in states)
        return CompletionResponse(
            id=plan.request_id,
            created=plan.created,
            model=self._model_name,
            choices=choices,
            usage=usage_of(plan.prompts, completion_tokens),
        )

    async def stream(self, plan: PlannedCompletion) -> AsyncIterator[bytes]:
        """SSE chunks: text deltas per choice, a usage chunk if asked for, then [DONE]."""
        completion_tokens = 0
        text_offsets: dict[int, int] = {}
        async for index, delta in run_generations(
            self._engine, plan.request_id, plan.prompts, self._observer
        ):
            completion_tokens += len(delta.token_ids)
            first = index not in text_offsets
            prompt_index = plan.prompt_of_choice(index)
            generated, positions = ("", []) if plan.request.echo_only else (delta.text, delta.logprobs or [])
            text = plan.echo_texts[prompt_index] + generated if first else generated
            if not text and delta.finish_reason is None:
                continue
            logprobs = None
            if plan.request.logprobs is not None:
                prompt_positions = delta.prompt_logprobs if first else None
                logprobs = await self._logprobs(
                    plan, prompt_index, prompt_positions, positions, text_offsets.get(index, 0)
                )
            text_offsets[index] = text_offsets.get(index, 0) + len(text)
            choice = CompletionChoice(
                index=index, text=text, logprobs=logprobs, finish_reason=delta.finish_reason
            )
            yield sse_event(self._chunk(plan, [choice]))
        if plan.request.include_usage_chunk:
            yield sse_event(self._chunk(plan, [], usage=usage_of(plan.prompts, completion_tokens)))
        yield DONE_EVENT

    async def _logprobs(
        self,
        plan: PlannedCompletion,
        prompt_index: int,
        prompt_positions: list[PositionLogprobs | None] | None,
        positions: list[PositionLogprobs],
        text_offset: int = 0,
    ) -> CompletionLogprobs:
        all_positions: list[PositionLogprobs | None] = [*(prompt_positions or []), *positions]
        tokens = []
        prompt_ids = plan.prompts[prompt_index].prompt.token_ids
        for position_index, position in enumerate(all_positions):
            if position is not None and position.chosen.token:
                tokens.append(position.chosen.token)
            else:  # the first prompt token has no logprob; a token may decode only in context
                token_id = position.chosen.token_id if position else prompt_ids[position_index]
                tokens.append(await self._engine.detokenize([token_id]))
        return completion_logprobs(all_positions, text_offset, tokens)

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


def _split_prompts(prompt: PromptInput) -> list[str | list[int]]:
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise EmptyPromptError()
    if all(isinstance(item, int) for item in prompt):
        return [list(prompt)]  # type: ignore[arg-type]
    return list(prompt)  # type: ignore[arg-type]
