"""The one way every generating route runs: context, plan, permit, run, respond.

`Pipeline.serve` is one request's whole life, top to bottom. Every error it meets is a
ServingError that knows its status (api/errors.py renders it); what the request holds is its
permit (policy/permits.py), released exactly once however the request ends.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Coroutine
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from llmserve.config import Config
from llmserve.engine.base import EngineClient
from llmserve.errors import ModelNotFoundError
from llmserve.metrics import RequestObservation
from llmserve.policy.permits import Cost, Permit, Permits
from llmserve.protocol.sampling import SamplingFields
from llmserve.runtime import EngineRuntime
from llmserve.serving.disconnect import ClientDisconnectedError, cancel_on_disconnect
from llmserve.serving.event_stream import EventStream
from llmserve.serving.generation import Observers, RequestContext

logger = logging.getLogger(__name__)

REQUEST_ID_HEADER = "x-request-id"
CLIENT_CLOSED_REQUEST = 499


class Plan(Protocol):
    @property
    def cost(self) -> Cost: ...


RequestT = TypeVar("RequestT", bound=SamplingFields, contravariant=True)
PlanT = TypeVar("PlanT", bound=Plan)


class Service(Protocol[RequestT, PlanT]):
    """What an endpoint knows: how to plan its request, and to answer it as JSON or as a stream."""

    @property
    def id_prefix(self) -> str: ...

    async def plan(self, engine: EngineClient, request: RequestT, context: RequestContext) -> PlanT: ...

    async def complete(self, engine: EngineClient, plan: PlanT, context: RequestContext) -> BaseModel: ...

    def stream(
        self, engine: EngineClient, plan: PlanT, context: RequestContext
    ) -> AsyncGenerator[bytes, None]: ...


class Pipeline:
    def __init__(self, config: Config, runtime: EngineRuntime, permits: Permits) -> None:
        self._model_name = config.server.served_model_name
        self._request_timeout_s = config.server.request_timeout_s
        self._runtime = runtime
        self._permits = permits

    async def serve(
        self,
        http: Request,
        request: RequestT,
        service: Service[RequestT, PlanT],
        key_id: str | None,
        observation: RequestObservation,
    ) -> Response:
        engine = self._runtime.engine()  # 503 while starting, draining or dead
        if request.model != self._model_name:
            raise ModelNotFoundError(request.model)
        timeout_s = min(self._request_timeout_s, request.timeout or self._request_timeout_s)
        permit = self._permits.issue(
            observation.route, key_id, timeout_s, observation, request.priority, observation.read_delay_s
        )
        context = RequestContext(f"{service.id_prefix}-{uuid.uuid4().hex}", Observers(observation, permit))
        try:
            async with permit:
                permit.check_capacity(request.n, request.requested_max_tokens())  # 429 before any work
                plan = await service.plan(engine, request, context)  # 400: validate, tokenize, fit
                permit.reserve(plan.cost)  # 429: the key's tokens
                await self._wait_for_slots(permit, http, observation)  # 429 when the queue gives up
                headers = {REQUEST_ID_HEADER: http.headers.get(REQUEST_ID_HEADER, context.request_id)}
                headers.update(permit.headers())
                if request.stream:  # the stream's producer holds the permit from here on
                    events = service.stream(engine, plan, context)
                    return EventStream(events, permit, context.request_id, observation, headers)
                answer = await self._run(permit, http, service.complete(engine, plan, context))
                return Response(answer.model_dump_json(), media_type="application/json", headers=headers)
        except ClientDisconnectedError:
            logger.info("request %s: client disconnected, generation aborted", context.request_id)
            observation.on_rejected("client_disconnected")
            return Response(status_code=CLIENT_CLOSED_REQUEST)

    async def _wait_for_slots(self, permit: Permit, http: Request, observation: RequestObservation) -> None:
        queued_at = time.perf_counter()
        if not permit.admit_now():  # a refusal or a free slot takes no turn of the event loop
            await cancel_on_disconnect(asyncio.create_task(permit.admit()), http)
        observation.on_admitted(time.perf_counter() - queued_at)

    async def _run(self, permit: Permit, http: Request, work: Coroutine[Any, Any, BaseModel]) -> BaseModel:
        """Generate within the deadline (504, or 503 when a drain cuts it) while the client waits."""
        permit.start()
        async with permit.deadline.scope():
            return await cancel_on_disconnect(asyncio.create_task(work), http)
