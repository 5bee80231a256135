"""The cheapest refusal: generation requests turned away before their body is read while this API
process is itself saturated (its event loop runs too far behind, policy/loop_lag.py). At GPU rates
the front end saturates before the engine does; then every step further into the request (body,
JSON, validation, dependencies) waits behind the same backlog."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from llmserve.api.errors import error_response
from llmserve.api.observability import OBSERVATION_KEY
from llmserve.metrics import GENERATION_ROUTES
from llmserve.policy.admission import Admission


class LoadShedMiddleware:
    def __init__(self, app: ASGIApp, admission: Admission) -> None:
        self.app = app
        self.admission = admission

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in GENERATION_ROUTES:
            refusal = self.admission.front_end_refusal()
            if refusal is not None:
                observation = scope.get("state", {}).get(OBSERVATION_KEY)
                if observation is not None:  # counted as every refusal is (api/errors.py)
                    observation.on_error(refusal)
                await error_response(refusal)(scope, receive, send)
                return
        await self.app(scope, receive, send)
