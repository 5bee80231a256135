"""/v1/chat/completions: messages -> the model's chat template -> engine -> JSON or SSE."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

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
from llmserve.serving.logprobs import chat_logprobs
from llmserve.serving.streaming import DONE_EVENT, sse_event

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PlannedChat:
    request: ChatCompletionRequest
    request_id: str
    created: int
    prompt: PlannedPrompt

    @property
    def engine_sequences(self) -> int:
        return engine_sequences([self.prompt])

    @property
    def prompt_tokens(self) -> int:
        return prompt_tokens([self.prompt])

    @property
    def max_new_tokens(self) -> int:
        return max_new_tokens([self.prompt])


class ChatService(GenerationService):
    async def plan(self, request: ChatCompletionRequest, request_id: str) -> PlannedChat:
        request.reject_unsupported()
        if ignored := request.unknown_fields_ignored():
            logger.info("request %s: ignoring unknown fields %s", request_id, ignored)
        info = self._engine.model_info
        request.check_token_ids(info.vocab_size)
        prompt = await self._engine.render_chat(
            request.engine_messages(),
            add_generation_prompt=request.opens_assistant_turn,
            continue_final_message=request.continue_final_message,
        )
        max_tokens = fit_max_tokens(
            len(prompt.token_ids), request.requested_max_tokens(), info, "messages", self._max_prompt_tokens
        )
        planned = PlannedPrompt(prompt, request.to_sampling_spec(max_tokens, info.sampling_defaults))
        return PlannedChat(request, request_id, unix_time(), planned)

    async def complete(self, plan: PlannedChat) -> ChatCompletionResponse:
        states = await collect_choices(self._engine, plan.request_id, [plan.prompt], self._observer)
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
            id=plan.request_id,
            created=plan.created,
            model=self._model_name,
            choices=choices,
            usage=usage_of([plan.prompt], sum(state.token_count for state in states)),
        )

    async def stream(self, plan: PlannedChat) -> AsyncIterator[bytes]:
        """A role chunk per choice, content deltas, finish_reason, a usage chunk if asked, [DONE]."""
        for index in range(plan.request.n):
            role = ChatStreamChoice(index=index, delta=DeltaMessage(role="assistant", content=""))
            yield sse_event(self._chunk(plan, [role]))
        completion_tokens = 0
        async for index, delta in run_generations(
            self._engine, plan.request_id, [plan.prompt], self._observer
        ):
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
            yield sse_event(self._chunk(plan, [choice]))
        if plan.request.include_usage_chunk:
            yield sse_event(self._chunk(plan, [], usage=usage_of([plan.prompt], completion_tokens)))
        yield DONE_EVENT

    def _chunk(
        self, plan: PlannedChat, choices: list[ChatStreamChoice], usage: UsageInfo | None = None
    ) -> ChatCompletionStreamResponse:
        return ChatCompletionStreamResponse(
            id=plan.request_id, created=plan.created, model=self._model_name, choices=choices, usage=usage
        )
