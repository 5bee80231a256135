"""The SSE response: events produced by a task of their own, relayed through a bounded buffer.

The producer runs the generation under the request's deadline and owns the request's permit
until it ends. The buffer holds STREAM_BUFFER_EVENTS events: a client that reads slowly holds
the producer back (vLLM then merges this request's pending output into one delta), so a slow
reader costs the server a few events of memory, not the whole generation. Once a stream has
begun its status line is sent: an error then travels as an SSE error event and `data: [DONE]`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import aclosing

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from llmserve.errors import ServingError, as_serving_error
from llmserve.metrics import RequestObservation
from llmserve.policy.permits import Permit
from llmserve.serving.streaming import DONE_EVENT, sse_event

logger = logging.getLogger(__name__)

STREAM_BUFFER_EVENTS = 8


class EventStream(StreamingResponse):
    def __init__(
        self,
        events: AsyncGenerator[bytes, None],
        permit: Permit,
        request_id: str,
        observation: RequestObservation,
        headers: Mapping[str, str],
    ) -> None:
        self._buffer: asyncio.Queue[bytes] = asyncio.Queue(STREAM_BUFFER_EVENTS)
        self._producer = asyncio.create_task(self._produce(events), name=f"stream-{request_id}")
        permit.hand_over(self._producer)
        self._permit = permit
        self._request_id = request_id
        self._observation = observation
        super().__init__(self._relay(), media_type="text/event-stream", headers=headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._producer.cancel()  # the client left, before the stream began or during it

    async def _produce(self, events: AsyncGenerator[bytes, None]) -> None:
        async with aclosing(events):
            async for event in events:
                await self._buffer.put(event)

    async def _relay(self) -> AsyncIterator[bytes]:
        getter: asyncio.Future[bytes] | None = None
        try:
            while True:
                getter = asyncio.ensure_future(self._buffer.get())
                await asyncio.wait({getter, self._producer}, return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()  # before the flush below, so it cannot take an event
                    break
                yield getter.result()
            while not self._buffer.empty():
                yield self._buffer.get_nowait()
            if (error := self._failure()) is not None:
                self._observation.on_error(error)
                yield sse_event(error.to_body())
                yield DONE_EVENT
        except (asyncio.CancelledError, GeneratorExit):
            logger.info("request %s: client disconnected mid-stream, generation aborted", self._request_id)
            self._observation.on_rejected("client_disconnected")
            raise
        finally:
            if getter is not None:
                getter.cancel()  # a client that leaves cancels us mid-wait; never leave it pending

    def _failure(self) -> ServingError | None:
        if self._producer.cancelled():
            deadline = self._permit.deadline
            logger.info("request %s: %s mid-stream, generation aborted", self._request_id, deadline.reason)
            return deadline.error()
        exc = self._producer.exception()
        return as_serving_error(exc) if exc is not None else None
