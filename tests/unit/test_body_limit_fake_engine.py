"""Bodies over server.max_request_body_bytes get 413 with an OpenAI error, declared or streamed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

from loadtest.prom import Scrape

from llmserve.config import parse_overrides
from tests.unit.conftest import MODEL, make_client

LIMIT = 2048


def oversized_body() -> bytes:
    return json.dumps({"model": MODEL, "prompt": "word " * LIMIT}).encode()


def test_declared_oversized_body_is_413_and_counted_as_too_large() -> None:
    with make_client(parse_overrides([f"server.max_request_body_bytes={LIMIT}"])) as client:
        response = client.post(
            "/v1/completions", content=oversized_body(), headers={"content-type": "application/json"}
        )
        assert response.status_code == 413
        assert response.json()["error"]["code"] == "request_too_large"
        scrape = Scrape.parse(client.get("/metrics").text)
        assert scrape.value("llmserve_rejections_total", reason="too_large") == 1
        assert scrape.value("llmserve_requests_total", status="413") == 1


def test_streamed_oversized_body_without_length_is_413() -> None:
    def chunks() -> Iterator[bytes]:
        body = oversized_body()
        for start in range(0, len(body), 512):
            yield body[start : start + 512]

    with make_client(parse_overrides([f"server.max_request_body_bytes={LIMIT}"])) as client:
        response = client.post(
            "/v1/completions", content=chunks(), headers={"content-type": "application/json"}
        )
        assert response.status_code == 413
        assert response.json()["error"]["code"] == "request_too_large"
        assert (
            Scrape.parse(client.get("/metrics").text).value("llmserve_rejections_total", reason="too_large")
            == 1
        )


def test_bodies_within_the_limit_are_served() -> None:
    with make_client(parse_overrides([f"server.max_request_body_bytes={LIMIT}"])) as client:
        response = client.post("/v1/completions", json={"model": MODEL, "prompt": "a b", "max_tokens": 1})
        assert response.status_code == 200


async def test_a_body_that_trickles_in_slower_than_the_read_timeout_is_408() -> None:
    from llmserve.api.body_limit import BodyLimitsMiddleware

    sent: list[dict[str, object]] = []
    chunks = [b'{"model": ', b'"x", "pro']

    async def app(scope: dict[str, object], receive: object, send: object) -> None:
        while True:
            message = await receive()  # type: ignore[operator]
            if not message.get("more_body"):
                break

    async def slow_receive() -> dict[str, object]:
        if chunks:
            return {"type": "http.request", "body": chunks.pop(0), "more_body": True}
        await asyncio.sleep(3600)  # the client stalls mid-body
        raise AssertionError("unreachable")

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    middleware = BodyLimitsMiddleware(app, max_body_bytes=LIMIT, read_timeout_s=0.2)  # type: ignore[arg-type]
    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": [], "state": {}}
    await asyncio.wait_for(middleware(scope, slow_receive, send), timeout=5)  # type: ignore[arg-type]
    assert sent[0]["status"] == 408
    assert json.loads(sent[1]["body"])["error"]["code"] == "body_read_timeout"  # type: ignore[arg-type]
