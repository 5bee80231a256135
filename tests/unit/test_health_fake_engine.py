"""/health and /ready with FakeEngine: starting, ready, dead."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi.testclient import TestClient

from llmserve.app import create_app
from llmserve.config import Config, load_config
from llmserve.engine.base import EngineClient
from tests.fake_engine import FakeEngine
from tests.unit.conftest import MODEL


def test_ready_engine_reports_healthy_and_ready(client: TestClient) -> None:
    assert client.get("/health").json() == {"status": "ok"}
    assert client.get("/ready").json() == {"status": "ready"}


def test_dead_engine_turns_health_and_readiness_503(client: TestClient, fake_engine: FakeEngine) -> None:
    fake_engine.dead = True
    for path in ("/health", "/ready"):
        response = client.get(path)
        assert response.status_code == 503
        assert response.json()["error"]["type"] == "service_unavailable"


def test_while_the_engine_starts_health_is_ok_and_requests_get_503() -> None:
    release = asyncio.Event()

    @asynccontextmanager
    async def slow_start(_: Config) -> AsyncIterator[EngineClient]:
        await release.wait()
        yield FakeEngine()

    app = create_app(load_config(), engine_starter=slow_start, on_fatal=lambda: None)
    with TestClient(app, raise_server_exceptions=False) as client:
        assert client.get("/health").status_code == 200
        ready = client.get("/ready")
        assert ready.status_code == 503
        assert ready.headers["retry-after"]
        completion = client.post("/v1/completions", json={"model": MODEL, "prompt": "a"})
        assert completion.status_code == 503
        assert completion.json()["error"]["code"] == "engine_not_ready"
        client.portal.call(release.set)  # type: ignore[union-attr]


def test_engine_that_fails_to_start_asks_the_process_to_exit_nonzero() -> None:
    fatal_calls: list[bool] = []

    @asynccontextmanager
    async def broken_start(_: Config) -> AsyncIterator[EngineClient]:
        raise RuntimeError("no model")
        yield FakeEngine()  # pragma: no cover

    app = create_app(load_config(), engine_starter=broken_start, on_fatal=lambda: fatal_calls.append(True))
    with TestClient(app, raise_server_exceptions=False) as client:
        deadline = time.monotonic() + 5
        while not fatal_calls and time.monotonic() < deadline:
            time.sleep(0.01)
        assert fatal_calls == [True]
        assert client.get("/health").status_code == 503
        assert app.state.runtime.exit_code == 1
