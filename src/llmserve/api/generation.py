"""What every generating route does after planning: stream SSE or answer JSON, and stop on disconnect."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel

from llmserve.api.admission import AdmissionController
from llmserve.api.auth import api_key_id
from llmserve.api.disconnect import ClientDisconnectedError, cancel_on_disconnect
from llmserve.api.errors import (
    APIError,
    model_not_found,
    record_error,
    service_unavailable,
    to_api_error,
)
from llmserve.api.observability import observation_of
from llmserve.api.openapi import error_responses
from llmserve.api.rate_limits import RateLimiter, TokenReservation
from llmserve.config import Config
from llmserve.deadlines import DeadlineBook, ExpiryReason, RequestDeadline
from llmserve.engine.base import EngineClient
from llmserve.metrics import RequestObservation
from llmserve.protocol.sampling import SamplingFields
from llmserve.serving.generation import GenerationObserver
from llmserve.serving.streaming import DONE_EVENT, sse_event

logger = logging.getLogger(__name__)

REQUEST_ID_HEADER = "x-request-id"
CLIENT_CLOSED_REQUEST = 499
ERROR_RESPONSES = error_responses(400, 401, 404, 408, 413, 415, 429, 500, 503, 504)


def timeout_for(config: Config, requested_s: float | None) -> float:
    """The server's limit, or less if the request asks for less."""
    limit = config.server.request_timeout_s
    return min(limit, requested_s) if requested_s is not None else limit


def check_model(config: Config, model: str) -> None:
    if model != config.server.served_model_name:
        raise model_not_found(model)


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def response_headers(request: Request, request_id: str) -> dict[str, str]:
    return {REQUEST_ID_HEADER: request.headers.get(REQUEST_ID_HEADER, request_id)}


def expiry_error(reason: ExpiryReason) -> APIError:
    if reason == "draining":
        return service_unavailable(
            "The server is shutting down and could not finish this request.", "draining", 1
        )
    return APIError(
        "The request did not finish within its timeout.",
        status_code=504,
        error_type="timeout_error",
        code="request_timeout",
    )


@dataclass(frozen=True)
class Admission:
    """What a planned request costs: engine sequences to admit, tokens reserved against its key."""

    sequences: int
    prompt_tokens: int
    reservation: TokenReservation | None = None

    def refund(self) -> None:
        """The request was refused before any work: it uses nothing."""
        if self.reservation is not None:
            self.reservation.settle(0)

    def settle(self, observation: RequestObservation | None) -> None:
        if self.reservation is not None:
            generated = observation.generated_tokens if observation is not None else 0
            self.reservation.settle(self.prompt_tokens + generated)

    def rate_limit_headers(self) -> dict[str, str]:
        return self.reservation.limits.headers() if self.reservation is not None else {}


def reserve(
    request: Request, limiter: RateLimiter, sequences: int, prompt_tokens: int, max_new_tokens: int
) -> Admission:
    """Reserve prompt + max_tokens against the caller's key (when keys and token limits are on)."""
    key_id = api_key_id(request)
    reservation = None
    if key_id is not None and limiter.enabled:
        reservation = limiter.reserve_tokens(key_id, prompt_tokens + max_new_tokens)
    return Admission(sequences, prompt_tokens, reservation)


def take_request(request: Request, limiter: RateLimiter) -> None:
    key_id = api_key_id(request)
    if key_id is not None and limiter.enabled:
        limiter.take_request(key_id)


class Plan(Protocol):
    @property
    def request_id(self) -> str: ...

    @property
    def engine_sequences(self) -> int: ...

    @property
    def prompt_tokens(self) -> int: ...

    @property
    def max_new_tokens(self) -> int: ...


RequestT = TypeVar("RequestT", bound=SamplingFields, contravariant=True)
PlanT = TypeVar("PlanT", bound=Plan)


class Service(Protocol[RequestT, PlanT]):
    async def plan(self, request: RequestT, request_id: str) -> PlanT: ...

    def stream(self, plan: PlanT) -> AsyncIterator[bytes]: ...

    async def complete(self, plan: PlanT) -> BaseModel: ...


class ServiceFactory(Protocol[RequestT, PlanT]):
    def __call__(
        self,
        engine: EngineClient,
        served_model_name: str,
        observer: GenerationObserver | None = None,
        max_prompt_tokens: int | None = None,
    ) -> Service[RequestT, PlanT]: ...


@dataclass(frozen=True)
class Gateway:
    """Everything a generation route needs, and the one way every generation route runs."""

    config: Config
    engine: EngineClient
    admission: AdmissionController
    limiter: RateLimiter

    async def serve(
        self,
        request: Request,
        body: RequestT,
        make_service: ServiceFactory[RequestT, PlanT],
        id_prefix: str,
    ) -> Response:
        """Refuse early what must be refused, plan (tokenize, fit the context), then answer."""
        check_model(self.config, body.model)
        take_request(request, self.limiter)
        self.admission.check_fast()
        service = make_service(
            self.engine,
            self.config.server.served_model_name,
            observation_of(request),
            max_prompt_tokens=self.config.admission.max_prompt_tokens,
        )
        plan = await service.plan(body, new_request_id(id_prefix))
        return await respond(
            request,
            plan.request_id,
            body.stream,
            timeout_for(self.config, body.timeout),
            reserve(request, self.limiter, plan.engine_sequences, plan.prompt_tokens, plan.max_new_tokens),
            lambda: service.stream(plan),
            lambda: service.complete(plan),
        )


async def respond(
    request: Request,
    request_id: str,
    stream: bool,
    timeout_s: float,
    admission: Admission,
    streamer: Callable[[], AsyncIterator[bytes]],
    completer: Callable[[], Coroutine[Any, Any, BaseModel]],
) -> Response:
    headers = {**response_headers(request, request_id), **admission.rate_limit_headers()}
    observation = observation_of(request)
    controller: AdmissionController = request.app.state.admission
    deadlines: DeadlineBook = request.app.state.runtime.deadlines
    queued_at = time.perf_counter()
    try:
        await cancel_on_disconnect(
            asyncio.create_task(controller.admit(admission.sequences, admission.prompt_tokens)), request
        )
    except ClientDisconnectedError:
        admission.refund()
        return _client_left(request_id, observation)
    except BaseException:
        admission.refund()
        raise
    if observation is not None:
        observation.on_admitted(time.perf_counter() - queued_at)
    if stream:
        queue: asyncio.Queue[bytes] = asyncio.Queue()
        producer = asyncio.create_task(_produce(streamer, queue, controller, admission, observation))
        deadline = deadlines.start(producer, timeout_s)
        return StreamingResponse(
            _relay(queue, producer, deadline, request_id, observation),
            media_type="text/event-stream",
            headers=headers,
        )
    completed = False
    work: asyncio.Task[BaseModel] = asyncio.create_task(completer())
    deadline = deadlines.start(work, timeout_s)
    try:
        body = await cancel_on_disconnect(work, request)
        completed = True
    except ClientDisconnectedError:
        return _client_left(request_id, observation)
    except asyncio.CancelledError:
        if deadline.expired is None:
            raise
        logger.info("request %s: %s, generation aborted", request_id, deadline.expired)
        raise expiry_error(deadline.expired) from None
    finally:
        deadline.release()
        controller.release(admission.sequences, completed=completed)
        admission.settle(observation)
    return Response(body.model_dump_json(), media_type="application/json", headers=headers)


def _client_left(request_id: str, observation: RequestObservation | None) -> Response:
    logger.info("request %s: client disconnected, generation aborted", request_id)
    if observation is not None:
        observation.on_rejected("client_disconnected")
    return Response(status_code=CLIENT_CLOSED_REQUEST)


async def _produce(
    streamer: Callable[[], AsyncIterator[bytes]],
    queue: asyncio.Queue[bytes],
    controller: AdmissionController,
    admission: Admission,
    observation: RequestObservation | None,
) -> None:
    """Runs the stream as a task of its own, which holds the admission slot until it ends."""
    completed = False
    try:
        async for chunk in streamer():
            await queue.put(chunk)
        completed = True
    finally:
        controller.release(admission.sequences, completed=completed)
        admission.settle(observation)


async def _relay(
    queue: asyncio.Queue[bytes],
    producer: asyncio.Task[None],
    deadline: RequestDeadline,
    request_id: str,
    observation: RequestObservation | None,
) -> AsyncIterator[bytes]:
    """Relay the producer's chunks. A deadline can stop the work and the client still gets an answer:
    once a stream has started its status is sent, so errors travel as an SSE error event + [DONE]."""
    getter: asyncio.Future[bytes] | None = None
    try:
        while True:
            getter = asyncio.ensure_future(queue.get())
            await asyncio.wait({getter, producer}, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()  # before the flush below, so it cannot take a chunk
                break
            yield getter.result()
        while not queue.empty():
            yield queue.get_nowait()
        error = None
        if producer.cancelled():
            reason = deadline.expired or "timeout"
            logger.info("request %s: %s mid-stream, generation aborted", request_id, reason)
            error = expiry_error(reason)
        elif (exc := producer.exception()) is not None:
            error = to_api_error(exc)
        if error is not None:
            record_error(observation, error)
            yield sse_event(error.to_body())
            yield DONE_EVENT
    except (asyncio.CancelledError, GeneratorExit):
        logger.info("request %s: client disconnected mid-stream, generation aborted", request_id)
        if observation is not None:
            observation.on_rejected("client_disconnected")
        raise
    finally:
        if getter is not None:
            getter.cancel()  # a client that leaves cancels us mid-wait; never leave the getter pending
        producer.cancel()
        deadline.release()
