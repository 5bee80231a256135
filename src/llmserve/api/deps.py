"""Annotated dependencies: what a route handler may ask for."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from llmserve.config import Config
from llmserve.engine.base import EngineClient
from llmserve.runtime import EngineRuntime


def get_config(request: Request) -> Config:
    config: Config = request.app.state.config
    return config


def get_runtime(request: Request) -> EngineRuntime:
    runtime: EngineRuntime = request.app.state.runtime
    return runtime


def get_engine(runtime: Annotated[EngineRuntime, Depends(get_runtime)]) -> EngineClient:
    return runtime.engine()


ConfigDep = Annotated[Config, Depends(get_config)]
RuntimeDep = Annotated[EngineRuntime, Depends(get_runtime)]
EngineDep = Annotated[EngineClient, Depends(get_engine)]
