"""A client that reads a stream slowly holds the generation back: the server buffers a bounded
number of events instead of everything the engine produces (a real server on a socket, FakeEngine)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn

from llmserve.app import create_app
from llmserve.config import load_config
from tests.fake_engine import FakeEngine, fake_starter
from tests.unit.conftest import MODEL

TOKENS = 20_000
SMALL_BUFFER = 4096


@pytest.fixture
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, FakeEngine]]:
    engine = FakeEngine(max_model_len=TOKENS + 100)
    app = create_app(load_config(None), engine_starter=fake_starter(engine), on_fatal=lambda: None)
    listener = socket.socket()
    # Accepted sockets inherit the listener's small send buffer, so the kernel absorbs little.
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SMALL_BUFFER)
    listener.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    port = listener.getsockname()[1]
    deadline = time.monotonic() + 10
    while not (server.started and app.state.runtime.is_ready):
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.01)
    try:
        yield port, engine
    finally:
        server.should_exit = True
        thread.join(10)


def test_a_slow_reader_holds_the_generation_back(served: tuple[int, FakeEngine]) -> None:
    port, engine = served
    before = engine.deltas_yielded  # calibration's, before the server reported ready
    body = json.dumps({"model": MODEL, "prompt": "a", "max_tokens": TOKENS, "stream": True}).encode()
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL_BUFFER)
    client.connect(("127.0.0.1", port))
    client.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    assert b"200 OK" in client.recv(1024), "the stream began"
    # The client reads nothing more: once the buffers on the way are full, the producer waits.
    time.sleep(1.0)
    held_back_at = engine.deltas_yielded
    time.sleep(1.0)
    assert engine.deltas_yielded == held_back_at, "nothing more is generated while nobody reads"
    streamed = held_back_at - before
    assert streamed < TOKENS // 10, f"{streamed} of {TOKENS} events buffered"
    print(f"\nslow reader: the server stopped after {streamed} of {TOKENS} events")
    # Reading again resumes the stream.
    client.settimeout(5)
    deadline = time.monotonic() + 10
    while engine.deltas_yielded <= held_back_at and time.monotonic() < deadline:
        client.recv(65536)
    assert engine.deltas_yielded > held_back_at, "reading resumes the generation"
    client.close()
