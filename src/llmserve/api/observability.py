"""Per-request measurement: an ASGI middleware that sees every status and the last byte sent."""

from __future__ import annotations

from fastapi import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llmserve.metrics import GENERATION_ROUTES, GatewayMetrics, RequestObservation

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
        scope.setdefault("state", {})[OBSERVATION_KEY] = observation
        status = 500  # what the client gets if nothing below answers
        in_flight = None
        if observation.route in GENERATION_ROUTES:
            in_flight = self.metrics.in_flight.labels(self.metrics.model, observation.route)
            in_flight.inc()

        async def send_and_watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_and_watch)
        finally:
            if in_flight is not None:
                in_flight.dec()
            observation.on_finished(status)


def observation_of(request: Request) -> RequestObservation | None:
    observation: RequestObservation | None = getattr(request.state, OBSERVATION_KEY, None)
    return observation
