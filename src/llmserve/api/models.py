"""GET /v1/models."""

from __future__ import annotations

from fastapi import APIRouter

from llmserve.api.deps import ConfigDep, EngineDep
from llmserve.api.openapi import error_responses
from llmserve.protocol.common import ModelCard, ModelList

router = APIRouter(tags=["models"])


@router.get("/v1/models", response_model=ModelList, responses=error_responses(401, 503))
async def list_models(config: ConfigDep, engine: EngineDep) -> ModelList:
    card = ModelCard(id=config.server.served_model_name, max_model_len=engine.model_info.max_model_len)
    return ModelList(data=[card])
