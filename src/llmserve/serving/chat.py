"""/v1/chat/completions: messages -> the model's chat template -> engine -> JSON or SSE."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from llmserve.engine.base import EngineClient
from llmserve.policy.permits import Cost
from llmserve.protocol.chat import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionStreamResponse,
    ChatStreamChoice,
    DeltaMessage,
)
from llmserve.protocol.common import UsageInfo, unix_time
from llmserve.serving.generation import (
    PlannedPrompt,
    RequestContext,
    collect_choices,
    cost_of,
    fit_max_tokens,
    run_generations,
    usage_of,
)
from llmserve.serving.logprobs import chat_logprobs
from llmserve.serving.streaming import DONE_EVENT, sse_event

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PlannedChat:
    request: ChatCompletionRequest
    created: int
    prompt: PlannedPrompt

    @property
    def cost(self) -> Cost:
        return cost_of([self.prompt])


class ChatService:
    """Built once at start-up; the engine and the request's context come with each call."""

    id_prefix = "chatcmpl"

    def __init__(self, served_model_name: str, max_prompt_tokens: int | None) -> None:
        self._model_name = served_model_name
        self._max_prompt_tokens = max_prompt_tokens

    async def plan(
        self, engine: EngineClient, request: ChatCompletionRequest, context: RequestContext
    ) -> PlannedChat:
        request.check_fields()
        if ignored := request.unknown_fields_ignored():
            logger.info("request %s: ignoring unknown fields %s", context.request_id, ignored)
        info = engine.model_info
        request.check_token_ids(info.vocab_size)
        prompt = await engine.render_chat(
            request.engine_messages(),
            add_generation_prompt=request.opens_assistant_turn,
            continue_final_message=request.continue_final_message,
        )
        max_tokens = fit_max_tokens(
            len(prompt.token_ids), request.requested_max_tokens(), info, "messages", self._max_prompt_tokens
        )
        planned = PlannedPrompt(prompt, request.to_sampling_spec(max_tokens, info.sampling_defaults))
        return PlannedChat(request, unix_time(), planned)

    async def complete(
        self, engine: EngineClient, plan: PlannedChat, context: RequestContext
    ) -> ChatCompletionResponse:
        states = await collect_choices(engine, context, [plan.prompt])
        choices = [
            ChatChoice(
                index=index,
                message=AssistantMessage(content=state.text),
                logprobs=chat_logprobs(state.logprobs) if plan.request.logprobs else None,
                finish_reason=state.finish_reason,
            )
            for index, state in enumerate(states)
        ]
        return ChatCompletionResponse(
            id=context.request_id,
            created=plan.created,
            model=self._model_name,
            choices=choices,
            usage=usage_of([plan.prompt], sum(state.token_count for state in states)),
        )

    async def stream(
        self, engine: EngineClient, plan: PlannedChat, context: RequestContext
    ) -> AsyncGenerator[bytes, None]:
        """A role chunk per choice, content deltas, finish_reason, a usage chunk if asked, [DONE]."""
        for index in range(plan.request.n):
            role = ChatStreamChoice(index=index, delta=DeltaMessage(role="assistant", content=""))
            yield sse_event(self._chunk(plan, context, [role]))
        completion_tokens = 0
        async for index, delta in run_generations(engine, context, [plan.prompt]):
            completion_tokens += len(delta.token_ids)
            if not delta.text and delta.finish_reason is None:
                continue
            logprobs = chat_logprobs(delta.logprobs or []) if plan.request.logprobs else None
            choice = ChatStreamChoice(
                index=index,
                delta=DeltaMessage(content=delta.text) if delta.text else DeltaMessage(),
                logprobs=logprobs,
                finish_reason=delta.finish_reason,
            )
            yield sse_event(self._chunk(plan, context, [choice]))
        if plan.request.include_usage_chunk:
            usage = usage_of([plan.prompt], completion_tokens)
            yield sse_event(self._chunk(plan, context, [], usage=usage))
        yield DONE_EVENT

    def _chunk(
        self,
        plan: PlannedChat,
        context: RequestContext,
        choices: list[ChatStreamChoice],
        usage: UsageInfo | None = None,
    ) -> ChatCompletionStreamResponse:
        return ChatCompletionStreamResponse(
            id=context.request_id, created=plan.created, model=self._model_name, choices=choices, usage=usage
        )
