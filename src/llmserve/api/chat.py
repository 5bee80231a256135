"""POST /v1/chat/completions."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from llmserve.api.deps import GatewayDep
from llmserve.api.generation import ERROR_RESPONSES
from llmserve.api.json_body import JsonBodyRoute
from llmserve.protocol.chat import ChatCompletionRequest, ChatCompletionResponse
from llmserve.serving.chat import ChatService

router = APIRouter(tags=["chat"], route_class=JsonBodyRoute)


@router.post(
    "/v1/chat/completions",
    response_model=ChatCompletionResponse,
    responses={200: {"content": {"text/event-stream": {}}}, **ERROR_RESPONSES},
)
async def create_chat_completion(
    body: ChatCompletionRequest, request: Request, gateway: GatewayDep
) -> Response:
    return await gateway.serve(request, body, ChatService, "chatcmpl")
