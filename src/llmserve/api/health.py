"""Liveness and readiness probes; they never need an API key."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from llmserve.api.deps import RuntimeDep
from llmserve.api.errors import service_unavailable
from llmserve.api.openapi import error_responses

router = APIRouter(tags=["health"])


@router.get(
    "/health", responses=error_responses(503), summary="The process is alive and its engine has not died"
)
async def health(runtime: RuntimeDep) -> Response:
    if runtime.is_failed:
        error = service_unavailable("The inference engine is not running.", "engine_dead")
        return error.to_response()
    return JSONResponse({"status": "ok"})


@router.get(
    "/ready",
    responses=error_responses(503),
    summary="The engine generated a token in the last few seconds and accepts requests",
)
async def ready(runtime: RuntimeDep) -> Response:
    if not await runtime.probe():
        error = service_unavailable("The inference engine is not ready yet.", "engine_not_ready", 5)
        return error.to_response()
    return JSONResponse({"status": "ready"})
