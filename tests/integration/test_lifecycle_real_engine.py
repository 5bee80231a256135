"""Timeouts and SIGTERM drain against real server processes (real vLLM, real SmolLM2)."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from loadtest.server_process import ServerProcess, start_server

from tests.integration.conftest import MODEL, READY_TIMEOUT_S
from tests.integration.test_metrics_real_engine import wait_idle

LONG = {"model": MODEL, "prompt": "1, 2, 3, 4, 5,", "max_tokens": 1500, "ignore_eos": True, "temperature": 0}


def test_timeout_aborts_the_engine_request_and_answers_504(server: ServerProcess) -> None:
    wait_idle(server)
    started = time.monotonic()
    response = httpx.post(f"{server.base_url}/v1/completions", json={**LONG, "timeout": 1.0}, timeout=30)
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "request_timeout"
    assert time.monotonic() - started < 5
    wait_idle(server, timeout_s=5)


def test_stream_timeout_sends_an_sse_error_then_done(server: ServerProcess) -> None:
    wait_idle(server)
    with httpx.stream(
        "POST", f"{server.base_url}/v1/completions", json={**LONG, "timeout": 1.5, "stream": True}, timeout=30
    ) as response:
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "request_timeout"
    assert len(events) > 3
    wait_idle(server, timeout_s=5)


class StreamReader(threading.Thread):
    def __init__(self, url: str, body: dict[str, object]) -> None:
        super().__init__(daemon=True)
        self.url, self.body = url, body
        self.events: list[str] = []
        self.first_event = threading.Event()

    def run(self) -> None:
        with httpx.stream("POST", self.url, json={**self.body, "stream": True}, timeout=120) as response:
            for line in response.iter_lines():
                if line:
                    self.events.append(line.removeprefix("data: "))
                    self.first_event.set()


@pytest.fixture(scope="module")
def drain_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server of its own: this test ends its life."""
    log = Path(tmp_path_factory.mktemp("drain")) / "server.log"
    process = start_server(log, "--set", "server.shutdown_timeout_s=8")
    try:
        process.wait_ready(READY_TIMEOUT_S)
        yield process
    finally:
        process.stop()


def test_sigterm_drains_in_flight_streams_refuses_new_work_and_exits_0(drain_server: ServerProcess) -> None:
    url = f"{drain_server.base_url}/v1/completions"
    short = StreamReader(url, {**LONG, "max_tokens": 24})
    long = StreamReader(url, LONG)
    for reader in (short, long):
        reader.start()
        assert reader.first_event.wait(60)
    drain_server.process.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert httpx.get(f"{drain_server.base_url}/ready").status_code == 503
    refused = httpx.post(url, json={**LONG, "max_tokens": 2}, timeout=10)
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "draining"
    short.join(60)
    long.join(60)
    assert short.events[-1] == "[DONE]"
    assert json.loads(short.events[-2])["choices"][0]["finish_reason"] == "length", "in-flight work finished"
    assert long.events[-1] == "[DONE]"
    assert json.loads(long.events[-2])["error"]["code"] == "draining", (
        "cut at the drain deadline, with an error"
    )
    assert drain_server.process.wait(timeout=60) == 0
