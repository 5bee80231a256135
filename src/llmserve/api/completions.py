"""POST /v1/completions."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from llmserve.api.deps import ConfigDep, EngineDep
from llmserve.api.disconnect import ClientDisconnectedError, cancel_on_disconnect
from llmserve.api.errors import APIError, model_not_found, to_api_error
from llmserve.protocol.common import ErrorResponse
from llmserve.protocol.completions import CompletionRequest, CompletionResponse
from llmserve.serving.completions import CompletionService
from llmserve.serving.streaming import DONE_EVENT, sse_event

logger = logging.getLogger(__name__)
router = APIRouter(tags=["completions"])

ERROR_RESPONSES: dict[int | str, dict[str, object]] = {
    status: {"model": ErrorResponse} for status in (400, 404, 500, 503)
}
REQUEST_ID_HEADER = "x-request-id"


@router.post(
    "/v1/completions",
    response_model=CompletionResponse,
    responses={200: {"content": {"text/event-stream": {}}}, **ERROR_RESPONSES},
)
async def create_completion(
    body: CompletionRequest, request: Request, config: ConfigDep, engine: EngineDep
) -> Response:
    if body.model != config.server.served_model_name:
        raise model_not_found(body.model)
    request_id = f"cmpl-{uuid.uuid4().hex}"
    headers = {REQUEST_ID_HEADER: request.headers.get(REQUEST_ID_HEADER, request_id)}
    service = CompletionService(engine, config.server.served_model_name)
    plan = await service.plan(body, request_id)
    if body.stream:
        return StreamingResponse(
            _stream_with_errors(service.stream(plan)),
            media_type="text/event-stream",
            headers=headers,
        )
    try:
        response = await cancel_on_disconnect(service.complete(plan), request)
    except ClientDisconnectedError:
        logger.info("request %s: client disconnected, generation aborted", request_id)
        return Response(status_code=499)
    return Response(response.model_dump_json(), media_type="application/json", headers=headers)


async def _stream_with_errors(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """Once a stream has started its status is sent: errors travel as an SSE error event."""
    try:
        async for chunk in chunks:
            yield chunk
    except Exception as exc:
        error: APIError = to_api_error(exc)
        yield sse_event(error.to_body())
        yield DONE_EVENT
