"""GET /metrics: Prometheus exposition of the gateway's and vLLM's own series."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from llmserve.api.openapi import error_responses
from llmserve.metrics import GatewayMetrics

router = APIRouter(tags=["metrics"])


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}}, **error_responses(401)},
)
async def metrics(request: Request) -> Response:
    gateway: GatewayMetrics = request.app.state.metrics
    return Response(gateway.exposition(), media_type=CONTENT_TYPE_LATEST)
