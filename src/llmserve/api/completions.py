"""POST /v1/completions."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from llmserve.api.deps import GatewayDep
from llmserve.api.generation import ERROR_RESPONSES
from llmserve.api.json_body import JsonBodyRoute
from llmserve.protocol.completions import CompletionRequest, CompletionResponse
from llmserve.serving.completions import CompletionService

router = APIRouter(tags=["completions"], route_class=JsonBodyRoute)


@router.post(
    "/v1/completions",
    response_model=CompletionResponse,
    responses={200: {"content": {"text/event-stream": {}}}, **ERROR_RESPONSES},
)
async def create_completion(body: CompletionRequest, request: Request, gateway: GatewayDep) -> Response:
    return await gateway.serve(request, body, CompletionService, "cmpl")
