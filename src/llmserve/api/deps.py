"""Annotated dependencies: what a route handler may ask for. All async: FastAPI runs sync ones in
its thread pool, a thread hop on every request."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from llmserve.api.observability import require_observation
from llmserve.config import Config
from llmserve.engine.base import EngineClient
from llmserve.metrics import RequestObservation
from llmserve.runtime import EngineRuntime
from llmserve.serving.chat import ChatService
from llmserve.serving.completions import CompletionService
from llmserve.serving.pipeline import Pipeline


@dataclass(frozen=True)
class Generation:
    """The pipeline and the endpoint services, built once by create_app."""

    pipeline: Pipeline
    completions: CompletionService
    chat: ChatService


async def get_config(request: Request) -> Config:
    config: Config = request.app.state.config
    return config


async def get_runtime(request: Request) -> EngineRuntime:
    runtime: EngineRuntime = request.app.state.runtime
    return runtime


async def get_engine(runtime: Annotated[EngineRuntime, Depends(get_runtime)]) -> EngineClient:
    return runtime.engine()


async def get_generation(request: Request) -> Generation:
    generation: Generation = request.app.state.generation
    return generation


ConfigDep = Annotated[Config, Depends(get_config)]
RuntimeDep = Annotated[EngineRuntime, Depends(get_runtime)]
EngineDep = Annotated[EngineClient, Depends(get_engine)]
GenerationDep = Annotated[Generation, Depends(get_generation)]
ObservationDep = Annotated[RequestObservation, Depends(require_observation)]
