"""Annotated dependencies: what a route handler may ask for."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from llmserve.api.admission import AdmissionController
from llmserve.api.generation import Gateway
from llmserve.api.rate_limits import RateLimiter
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


def get_admission(request: Request) -> AdmissionController:
    admission: AdmissionController = request.app.state.admission
    return admission


def get_rate_limiter(request: Request) -> RateLimiter:
    limiter: RateLimiter = request.app.state.rate_limiter
    return limiter


ConfigDep = Annotated[Config, Depends(get_config)]
RateLimiterDep = Annotated[RateLimiter, Depends(get_rate_limiter)]
AdmissionDep = Annotated[AdmissionController, Depends(get_admission)]
RuntimeDep = Annotated[EngineRuntime, Depends(get_runtime)]
EngineDep = Annotated[EngineClient, Depends(get_engine)]


def get_gateway(
    config: ConfigDep, engine: EngineDep, admission: AdmissionDep, limiter: RateLimiterDep
) -> Gateway:
    return Gateway(config, engine, admission, limiter)


GatewayDep = Annotated[Gateway, Depends(get_gateway)]
