"""Per-request timeouts and draining, with a slow FakeEngine: work is aborted and answered."""

from __future__ import annotations

import json
import time

from fastapi.testclient import TestClient
from loadtest.prom import Scrape

from llmserve.config import parse_overrides
from tests.fake_engine import FakeEngine
from tests.unit.conftest import MODEL, make_client
from tests.unit.test_completions_api_fake_engine import sse_payloads


def slow_engine() -> FakeEngine:
    engine = FakeEngine()
    engine.token_delay_s = 0.05
    return engine


def test_request_timeout_aborts_generation_and_answers_504() -> None:
    engine = slow_engine()
    with make_client(engine=engine) as client:
        started = time.monotonic()
        response = client.post(
            "/v1/completions", json={"model": MODEL, "prompt": "a", "max_tokens": 60, "timeout": 0.3}
        )
        assert time.monotonic() - started < 2
        assert response.status_code == 504
        assert response.json()["error"]["code"] == "request_timeout"
        assert engine.aborted, "the engine request was aborted"
        scrape = Scrape.parse(client.get("/metrics").text)
        assert scrape.value("llmserve_rejections_total", reason="timeout") == 1


def test_stream_timeout_ends_with_an_sse_error_and_done() -> None:
    engine = slow_engine()
    with make_client(engine=engine) as client:
        body = {"model": MODEL, "prompt": "a", "max_tokens": 60, "timeout": 0.3, "stream": True}
        payloads = sse_payloads(client.post("/v1/completions", json=body).text)
        assert payloads[-1] == "[DONE]"
        assert json.loads(payloads[-2])["error"]["code"] == "request_timeout"
        assert len(payloads) > 3, "tokens made before the deadline were sent"
        assert engine.aborted


def test_server_limit_caps_what_a_request_asks_for() -> None:
    with make_client(parse_overrides(["server.request_timeout_s=0.2"]), engine=slow_engine()) as client:
        body = {"model": MODEL, "prompt": "a", "max_tokens": 60, "timeout": 100}
        assert client.post("/v1/completions", json=body).status_code == 504


def test_requests_within_their_timeout_are_untouched() -> None:
    with make_client(engine=slow_engine()) as client:
        body = {"model": MODEL, "prompt": "a", "max_tokens": 3, "timeout": 5}
        assert client.post("/v1/completions", json=body).json()["choices"][0]["finish_reason"] == "length"


def test_draining_refuses_new_requests_and_turns_readiness_false(client: TestClient) -> None:
    runtime = client.app.state.runtime  # type: ignore[attr-defined]
    client.portal.call(runtime.begin_drain, 5.0)  # type: ignore[union-attr]
    assert client.get("/ready").status_code == 503
    assert client.get("/health").status_code == 200
    response = client.post("/v1/completions", json={"model": MODEL, "prompt": "a", "max_tokens": 1})
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "draining"
    assert response.headers["retry-after"]
    scrape = Scrape.parse(client.get("/metrics").text)
    assert scrape.value("llmserve_rejections_total", reason="draining") == 1
    assert runtime.drained


def test_a_request_cut_by_the_drain_deadline_is_answered_and_counted_once() -> None:
    import threading

    with make_client(engine=slow_engine()) as client:
        runtime = client.app.state.runtime  # type: ignore[attr-defined]
        answers = []
        body = {"model": MODEL, "prompt": "a", "max_tokens": 60}
        worker = threading.Thread(target=lambda: answers.append(client.post("/v1/completions", json=body)))
        worker.start()
        while client.app.state.permits.in_flight() == 0:  # type: ignore[attr-defined]
            time.sleep(0.01)
        client.portal.call(runtime.begin_drain, 0.2)  # type: ignore[union-attr]
        worker.join(5)
        assert answers[0].status_code == 503
        assert answers[0].json()["error"]["code"] == "draining"
        scrape = Scrape.parse(client.get("/metrics").text)
        assert scrape.value("llmserve_rejections_total", reason="draining") == 1
        assert scrape.value("llmserve_request_errors_total", code="draining") == 1
