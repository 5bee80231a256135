"""POST /v1/completions."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from llmserve.api.auth import ApiKeyDep
from llmserve.api.deps import GenerationDep, ObservationDep
from llmserve.api.json_body import JsonBodyRoute
from llmserve.api.openapi import GENERATION_ERROR_RESPONSES
from llmserve.protocol.completions import CompletionRequest, CompletionResponse

router = APIRouter(tags=["completions"], route_class=JsonBodyRoute)


@router.post(
    "/v1/completions",
    response_model=CompletionResponse,
    responses={200: {"content": {"text/event-stream": {}}}, **GENERATION_ERROR_RESPONSES},
)
async def create_completion(
    body: CompletionRequest,
    request: Request,
    key: ApiKeyDep,
    observation: ObservationDep,
    generation: GenerationDep,
) -> Response:
    return await generation.pipeline.serve(request, body, generation.completions, key, observation)
