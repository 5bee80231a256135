"""Per-request measurement: an ASGI middleware that sees every status and the last byte sent."""

from __future__ import annotations

from fastapi import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llmserve.api.read_delay import READ_DELAY_KEY
from llmserve.metrics import GatewayMetrics, RequestObservation

OBSERVATION_KEY = "observation"


class MetricsMiddleware:
    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        observation = self.metrics.observation(scope["path"])
        state = scope.setdefault("state", {})
        state[OBSERVATION_KEY] = observation
        observation.on_read(state.get(READ_DELAY_KEY, 0.0))
        status = 500  # what the client gets if nothing below answers

        async def send_and_watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_and_watch)
        finally:
            observation.on_finished(status)


def observation_of(request: Request) -> RequestObservation | None:
    """The request's measurements, opened by the middleware (absent only in apps built without it)."""
    observation: RequestObservation | None = getattr(request.state, OBSERVATION_KEY, None)
    return observation


async def require_observation(request: Request) -> RequestObservation:
    observation = observation_of(request)
    if observation is None:
        raise RuntimeError("MetricsMiddleware must wrap the generation routes")
    return observation
