"""Engines behind one protocol; `start_engine` picks the one the config names."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from llmserve.config import Config
from llmserve.engine.base import EngineClient


@asynccontextmanager
async def start_engine(config: Config) -> AsyncIterator[EngineClient]:
    if config.engine.backend == "transformers":
        from llmserve.engine.transformers_engine import start_transformers_engine

        async with start_transformers_engine(config.engine) as baseline:
            yield baseline
        return

    from llmserve.engine.vllm_engine import start_vllm_engine

    async with start_vllm_engine(config.engine, config.server.served_model_name) as engine:
        yield engine
