"""/health and /ready with FakeEngine: starting, ready, dead."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

from fastapi.testclient import TestClient

from llmserve.app import create_app
from llmserve.config import Config, load_config, parse_overrides
from llmserve.engine.base import EngineClient
from tests.fake_engine import FakeEngine, fake_starter
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


def test_readiness_probe_generates_a_token_and_is_cached(fake_engine: FakeEngine) -> None:
    from tests.unit.conftest import make_client

    with make_client(engine=fake_engine) as client:
        probes_at_start = fake_engine.started.count("llmserve-warmup")
        for _ in range(5):
            assert client.get("/ready").status_code == 200
        assert fake_engine.started.count("llmserve-warmup") == probes_at_start, "cached within the TTL"
    with make_client(parse_overrides(["server.readiness_probe_ttl_s=0"]), engine=fake_engine) as client:
        before = fake_engine.started.count("llmserve-warmup")
        client.get("/ready")
        client.get("/ready")
        assert fake_engine.started.count("llmserve-warmup") == before + 2, "TTL 0: every probe generates"


def test_an_engine_that_stops_generating_is_not_ready() -> None:
    from tests.unit.conftest import make_client

    engine = FakeEngine()
    with make_client(
        parse_overrides(["server.readiness_probe_ttl_s=0", "server.readiness_probe_timeout_s=0.1"]),
        engine=engine,
    ) as client:
        engine.token_delay_s = 1.0
        assert client.get("/ready").status_code == 503
        assert client.get("/health").status_code == 200, "slow is not dead (yet)"


def test_a_probe_still_generating_when_the_drain_begins_answers_503() -> None:
    from tests.unit.conftest import make_client

    engine = FakeEngine()
    with make_client(parse_overrides(["server.readiness_probe_ttl_s=0"]), engine=engine) as client:
        engine.token_delay_s = 0.5
        probes_before = engine.started.count("llmserve-warmup")
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(client.get, "/ready")
            while engine.started.count("llmserve-warmup") == probes_before:
                time.sleep(0.01)
            client.portal.call(client.app.state.runtime.begin_drain, 5.0)  # type: ignore[attr-defined, union-attr]
            assert answer.result(timeout=10).status_code == 503


def test_an_engine_that_dies_ends_the_process_with_exit_code_1() -> None:
    engine, fatal = FakeEngine(), []
    app = create_app(load_config(), engine_starter=fake_starter(engine), on_fatal=lambda: fatal.append(1))
    with TestClient(app, raise_server_exceptions=False) as client:
        while client.get("/ready").status_code != 200:
            time.sleep(0.01)
        engine.dead = True
        deadline = time.monotonic() + 5
        while not fatal and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fatal == [1]
        assert app.state.runtime.exit_code == 1
        assert client.get("/health").status_code == 503


def test_the_startup_heap_is_frozen_while_serving_and_thawed_on_stop(fake_engine: FakeEngine) -> None:
    """Generation-2 collections must not walk start-up's objects during serving (the p99 tail)."""
    import gc

    from tests.unit.conftest import make_client

    with make_client(engine=fake_engine) as client:
        assert client.get("/ready").status_code == 200
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
