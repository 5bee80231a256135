"""Refuse request bodies over the configured size with 413, before they are read into memory."""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llmserve.api.errors import TOO_LARGE_CODE, APIError, record_error
from llmserve.api.observability import OBSERVATION_KEY
from llmserve.metrics import RequestObservation


def too_large_message(limit: int) -> str:
    return f"The request body is larger than this server accepts ({limit} bytes)."


class BodyTooLargeError(HTTPException):
    """Raised while the body streams in; FastAPI passes HTTPExceptions to the error handlers."""

    def __init__(self, limit: int) -> None:
        super().__init__(status_code=413, detail=too_large_message(limit))


class BodySizeLimitMiddleware:
    """Checks Content-Length up front, and counts the bytes of bodies sent without one."""

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            await self._refuse(scope, receive, send)
            return
        received = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise BodyTooLargeError(self.max_body_bytes)
            return message

        async def watching_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, watching_send)
        except BodyTooLargeError:
            if not started:
                await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        observation: RequestObservation | None = scope.get("state", {}).get(OBSERVATION_KEY)
        error = APIError(too_large_message(self.max_body_bytes), status_code=413, code=TOO_LARGE_CODE)
        record_error(observation, error)
        await error.to_response()(scope, receive, send)
