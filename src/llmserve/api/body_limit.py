"""Limits on request bodies, enforced while they stream in: size (413) and read time (408).

A body over the size limit is refused before it is read into memory; a body that trickles in
slower than `server.body_read_timeout_s` (a slowloris client) is refused instead of holding a
connection and its buffers for ever.
"""

from __future__ import annotations

import asyncio
import time

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llmserve.api.errors import error_response
from llmserve.api.observability import OBSERVATION_KEY
from llmserve.errors import BodyReadTimeoutError, BodyTooLargeError, ServingError
from llmserve.metrics import RequestObservation


def too_large_message(limit: int) -> str:
    return f"The request body is larger than this server accepts ({limit} bytes)."


def too_slow_message(limit_s: float) -> str:
    return f"The request body did not arrive within {limit_s:g} s."


class BodyRefusedError(HTTPException):
    """Raised while the body streams in; FastAPI passes HTTPExceptions to the error handlers."""

    def __init__(self, error: ServingError) -> None:
        super().__init__(status_code=error.status_code, detail=error.message)
        self.error = error


class BodyLimitsMiddleware:
    """Checks Content-Length up front, counts the bytes of bodies sent without one, and times the read."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, read_timeout_s: float) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.read_timeout_s = read_timeout_s

    def _too_large(self) -> ServingError:
        return BodyTooLargeError(too_large_message(self.max_body_bytes))

    def _too_slow(self) -> ServingError:
        return BodyReadTimeoutError(too_slow_message(self.read_timeout_s))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            await self._refuse(scope, receive, send, self._too_large())
            return
        deadline = time.monotonic() + self.read_timeout_s
        received = 0
        body_complete = False
        started = False

        async def guarded_receive() -> Message:
            nonlocal received, body_complete
            if body_complete:  # afterwards only http.disconnect can come: wait as long as it takes
                return await receive()
            try:  # not wait_for: on Python 3.11 it runs receive() as a task, a turn of the loop
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    message = await receive()
            except TimeoutError:
                raise BodyRefusedError(self._too_slow()) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                body_complete = not message.get("more_body", False)
                if received > self.max_body_bytes:
                    raise BodyRefusedError(self._too_large())
            else:
                body_complete = True
            return message

        async def watching_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, guarded_receive, watching_send)
        except BodyRefusedError as refused:
            if not started:
                await self._refuse(scope, receive, send, refused.error)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, error: ServingError) -> None:
        observation: RequestObservation | None = scope.get("state", {}).get(OBSERVATION_KEY)
        if observation is not None:
            observation.on_error(error)
        await error_response(error)(scope, receive, send)
