"""POST /v1/chat/completions."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from llmserve.api.auth import ApiKeyDep
from llmserve.api.deps import GenerationDep, ObservationDep
from llmserve.api.json_body import JsonBodyRoute
from llmserve.api.openapi import GENERATION_ERROR_RESPONSES
from llmserve.protocol.chat import ChatCompletionRequest, ChatCompletionResponse

router = APIRouter(tags=["chat"], route_class=JsonBodyRoute)


@router.post(
    "/v1/chat/completions",
    response_model=ChatCompletionResponse,
    responses={200: {"content": {"text/event-stream": {}}}, **GENERATION_ERROR_RESPONSES},
)
async def create_chat_completion(
    body: ChatCompletionRequest,
    request: Request,
    key: ApiKeyDep,
    observation: ObservationDep,
    generation: GenerationDep,
) -> Response:
    return await generation.pipeline.serve(request, body, generation.chat, key, observation)
