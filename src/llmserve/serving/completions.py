"""/v1/completions: validated request -> engine generations -> one JSON body or an SSE stream."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from llmserve.engine.base import EngineClient, PositionLogprobs, TokenizedPrompt
from llmserve.errors import InvalidParameterError
from llmserve.policy.permits import Cost
from llmserve.protocol.common import UsageInfo, unix_time
from llmserve.protocol.completions import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    CompletionStreamResponse,
)
from llmserve.serving.generation import (
    PlannedPrompt,
    RequestContext,
    collect_choices,
    cost_of,
    fit_max_tokens,
    run_generations,
    usage_of,
)
from llmserve.serving.logprobs import completion_logprobs
from llmserve.serving.streaming import DONE_EVENT, sse_event

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PlannedCompletion:
    """A request whose prompts are tokenized and checked against the context window."""

    request: CompletionRequest
    created: int
    prompts: list[PlannedPrompt]
    echo_texts: list[str]

    def prompt_of_choice(self, choice_index: int) -> int:
        return choice_index // self.request.n

    @property
    def cost(self) -> Cost:
        return cost_of(self.prompts)


class CompletionService:
    """Built once at start-up; the engine and the request's context come with each call."""

    id_prefix = "cmpl"

    def __init__(self, served_model_name: str, max_prompt_tokens: int | None) -> None:
        self._model_name = served_model_name
        self._max_prompt_tokens = max_prompt_tokens

    async def plan(
        self, engine: EngineClient, request: CompletionRequest, context: RequestContext
    ) -> PlannedCompletion:
        request.check_fields()
        if request.unknown_fields:
            logger.info("request %s: ignoring unknown fields %s", context.request_id, request.unknown_fields)
        info = engine.model_info
        request.check_token_ids(info.vocab_size)
        planned, echo_texts = [], []
        # Scoring a prompt (echo, max_tokens 0) still runs one step: vLLM generates a token at least.
        requested = 1 if request.echo_only else request.requested_max_tokens()
        for prompt_input in request.prompts():
            prompt = await _tokenize(engine, prompt_input)
            max_tokens = fit_max_tokens(
                len(prompt.token_ids), requested, info, "prompt", self._max_prompt_tokens
            )
            prompt_logprobs = request.logprobs if request.echo and request.logprobs is not None else None
            sampling = request.to_sampling_spec(
                max_tokens, info.sampling_defaults, prompt_logprobs=prompt_logprobs
            )
            planned.append(PlannedPrompt(prompt, sampling))
            echo_texts.append(await _prompt_text(engine, prompt) if request.echo else "")
        return PlannedCompletion(request, unix_time(), planned, echo_texts)

    async def complete(
        self, engine: EngineClient, plan: PlannedCompletion, context: RequestContext
    ) -> CompletionResponse:
        states = await collect_choices(engine, context, plan.prompts)
        choices = []
        for index, state in enumerate(states):
            prompt_index = plan.prompt_of_choice(index)
            echo = plan.echo_texts[prompt_index]
            generated, positions = ("", []) if plan.request.echo_only else (state.text, state.logprobs)
            logprobs = None
            if plan.request.logprobs is not None:
                logprobs = await _logprobs(engine, plan, prompt_index, state.prompt_logprobs, positions)
            choices.append(
                CompletionChoice(
                    index=index, text=echo + generated, logprobs=logprobs, finish_reason=state.finish_reason
                )
            )
        completion_tokens = sum(state.token_count for state in states)
        return CompletionResponse(
            id=context.request_id,
            created=plan.created,
            model=self._model_name,
            choices=choices,
            usage=usage_of(plan.prompts, completion_tokens),
        )

    async def stream(
        self, engine: EngineClient, plan: PlannedCompletion, context: RequestContext
    ) -> AsyncGenerator[bytes, None]:
        """SSE chunks: text deltas per choice, a usage chunk if asked for, then [DONE]."""
        completion_tokens = 0
        text_offsets: dict[int, int] = {}
        async for index, delta in run_generations(engine, context, plan.prompts):
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
                logprobs = await _logprobs(
                    engine, plan, prompt_index, prompt_positions, positions, text_offsets.get(index, 0)
                )
            text_offsets[index] = text_offsets.get(index, 0) + len(text)
            choice = CompletionChoice(
                index=index, text=text, logprobs=logprobs, finish_reason=delta.finish_reason
            )
            yield sse_event(self._chunk(plan, context, [choice]))
        if plan.request.include_usage_chunk:
            usage = usage_of(plan.prompts, completion_tokens)
            yield sse_event(self._chunk(plan, context, [], usage=usage))
        yield DONE_EVENT

    def _chunk(
        self,
        plan: PlannedCompletion,
        context: RequestContext,
        choices: list[CompletionChoice],
        usage: UsageInfo | None = None,
    ) -> CompletionStreamResponse:
        return CompletionStreamResponse(
            id=context.request_id, created=plan.created, model=self._model_name, choices=choices, usage=usage
        )


async def _tokenize(engine: EngineClient, prompt: str | list[int]) -> TokenizedPrompt:
    tokenized = (
        await engine.tokenize(prompt) if isinstance(prompt, str) else TokenizedPrompt(token_ids=tuple(prompt))
    )
    if not tokenized.token_ids:
        raise InvalidParameterError("prompt", "must contain at least one token")
    return tokenized


async def _prompt_text(engine: EngineClient, prompt: TokenizedPrompt) -> str:
    return prompt.text if prompt.text is not None else await engine.detokenize(prompt.token_ids)


async def _logprobs(
    engine: EngineClient,
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
            tokens.append(await engine.detokenize([token_id]))
    return completion_logprobs(all_positions, text_offset, tokens)
