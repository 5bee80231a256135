"""What every generating route does after planning: stream SSE or answer JSON, and stop on disconnect."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel

from llmserve.api.disconnect import ClientDisconnectedError, cancel_on_disconnect
from llmserve.api.errors import model_not_found, to_api_error
from llmserve.api.observability import observation_of
from llmserve.config import Config
from llmserve.metrics import RequestObservation
from llmserve.protocol.common import ErrorResponse
from llmserve.serving.streaming import DONE_EVENT, sse_event

logger = logging.getLogger(__name__)

REQUEST_ID_HEADER = "x-request-id"
CLIENT_CLOSED_REQUEST = 499
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse} for status in (400, 404, 500, 503)
}


def check_model(config: Config, model: str) -> None:
    if model != config.server.served_model_name:
        raise model_not_found(model)


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def response_headers(request: Request, request_id: str) -> dict[str, str]:
    return {REQUEST_ID_HEADER: request.headers.get(REQUEST_ID_HEADER, request_id)}


async def respond(
    request: Request,
    request_id: str,
    stream: bool,
    streamer: Callable[[], AsyncIterator[bytes]],
    completer: Callable[[], Coroutine[Any, Any, BaseModel]],
) -> Response:
    headers = response_headers(request, request_id)
    observation = observation_of(request)
    if stream:
        return StreamingResponse(
            _stream_with_errors(streamer(), request_id, observation),
            media_type="text/event-stream",
            headers=headers,
        )
    try:
        body = await cancel_on_disconnect(completer(), request)
    except ClientDisconnectedError:
        logger.info("request %s: client disconnected, generation aborted", request_id)
        if observation is not None:
            observation.on_rejected("client_disconnected")
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    return Response(body.model_dump_json(), media_type="application/json", headers=headers)


async def _stream_with_errors(
    chunks: AsyncIterator[bytes], request_id: str, observation: RequestObservation | None
) -> AsyncIterator[bytes]:
    """Once a stream has started its status is sent: errors travel as an SSE error event."""
    try:
        async for chunk in chunks:
            yield chunk
    except (asyncio.CancelledError, GeneratorExit):
        logger.info("request %s: client disconnected mid-stream, generation aborted", request_id)
        if observation is not None:
            observation.on_rejected("client_disconnected")
        raise
    except Exception as exc:
        error = to_api_error(exc)
        if observation is not None:
            observation.on_error(error.code)
        yield sse_event(error.to_body())
        yield DONE_EVENT
