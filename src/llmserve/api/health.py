"""Liveness and readiness probes; they never need an API key."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from llmserve.api.deps import RuntimeDep
from llmserve.api.errors import error_response
from llmserve.api.openapi import error_responses
from llmserve.errors import EngineDeadError, EngineNotReadyError

router = APIRouter(tags=["health"])


@router.get(
    "/health", responses=error_responses(503), summary="The process is alive and its engine has not died"
)
async def health(runtime: RuntimeDep) -> Response:
    if runtime.is_failed:
        return error_response(EngineDeadError())
    return JSONResponse({"status": "ok"})


@router.get(
    "/ready",
    responses=error_responses(503),
    summary="The engine generated a token in the last few seconds and accepts requests",
)
async def ready(runtime: RuntimeDep) -> Response:
    if not await runtime.probe():
        return error_response(EngineNotReadyError())
    return JSONResponse({"status": "ready"})
