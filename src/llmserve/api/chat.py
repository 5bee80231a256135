"""POST /v1/chat/completions."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from llmserve.api.deps import AdmissionDep, ConfigDep, EngineDep, RateLimiterDep
from llmserve.api.generation import (
    ERROR_RESPONSES,
    check_model,
    new_request_id,
    reserve,
    respond,
    take_request,
    timeout_for,
)
from llmserve.api.observability import observation_of
from llmserve.protocol.chat import ChatCompletionRequest, ChatCompletionResponse
from llmserve.serving.chat import ChatService

router = APIRouter(tags=["chat"])


@router.post(
    "/v1/chat/completions",
    response_model=ChatCompletionResponse,
    responses={200: {"content": {"text/event-stream": {}}}, **ERROR_RESPONSES},
)
async def create_chat_completion(
    body: ChatCompletionRequest,
    request: Request,
    config: ConfigDep,
    engine: EngineDep,
    admission: AdmissionDep,
    limiter: RateLimiterDep,
) -> Response:
    check_model(config, body.model)
    take_request(request, limiter)
    admission.check_fast()
    service = ChatService(
        engine,
        config.server.served_model_name,
        observation_of(request),
        max_prompt_tokens=config.admission.max_prompt_tokens,
    )
    plan = await service.plan(body, new_request_id("chatcmpl"))
    return await respond(
        request,
        plan.request_id,
        body.stream,
        timeout_for(config, body.timeout),
        reserve(request, limiter, plan.engine_sequences, plan.prompt_tokens, plan.max_new_tokens),
        lambda: service.stream(plan),
        lambda: service.complete(plan),
    )
