from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from fastapi.testclient import TestClient

from llmserve.app import create_app
from llmserve.config import load_config
from tests.fake_engine import FakeEngine, fake_starter

MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture
def fake_engine() -> FakeEngine:
    return FakeEngine()


@contextmanager
def make_client(
    overrides: dict[str, Any] | None = None, engine: FakeEngine | None = None
) -> Iterator[TestClient]:
    """The real app (middleware, routers, errors, serving) in front of FakeEngine, started and ready."""
    starter = fake_starter(engine or FakeEngine())
    app = create_app(load_config(None, overrides), engine_starter=starter, on_fatal=lambda: None)
    with TestClient(app, raise_server_exceptions=False) as test_client:
        deadline = time.monotonic() + 5
        while test_client.get("/ready").status_code != 200:
            assert time.monotonic() < deadline, "fake engine never became ready"
            time.sleep(0.01)
        yield test_client


@pytest.fixture
def client(fake_engine: FakeEngine) -> Iterator[TestClient]:
    with make_client(engine=fake_engine) as test_client:
        yield test_client
