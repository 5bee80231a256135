"""How long a request waited in the kernel before the API process read it (Linux only): in the
accept queue or the socket's buffer, where the client's clock runs but the server's does not."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from llmserve.api.read_delay import READ_DELAY_KEY, ReadDelayHttpToolsProtocol, read_delay_s

pytestmark = pytest.mark.skipif(not hasattr(socket, "TCP_INFO"), reason="TCP_INFO is Linux's")


def test_a_connection_accepted_late_tells_how_long_its_data_waited() -> None:
    with (
        socket.create_server(("127.0.0.1", 0)) as listening,
        socket.create_connection(listening.getsockname()) as client,
    ):
        client.sendall(b"GET / HTTP/1.1\r\n\r\n")
        time.sleep(0.3)
        accepted, _ = listening.accept()
        with accepted:
            assert 0.25 <= read_delay_s(accepted) < 5


def test_sockets_that_do_not_tell_read_as_no_delay() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        assert read_delay_s(udp) == 0.0
    assert read_delay_s(None) == 0.0


async def test_the_server_hands_each_request_its_read_delay_in_the_scope() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        body = str(scope["state"][READ_DELAY_KEY]).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-length", b"%d" % len(body))],
            }
        )
        await send({"type": "http.response.body", "body": body})

    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, http=ReadDelayHttpToolsProtocol, lifespan="off", log_level="warning"
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    try:
        while not server.started:  # noqa: ASYNC110 (uvicorn has no event for it)
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        loop = asyncio.get_running_loop()
        with socket.create_connection(("127.0.0.1", port)) as client:
            client.sendall(b"GET / HTTP/1.1\r\nHost: test\r\n\r\n")
            time.sleep(0.3)  # noqa: ASYNC251 (the point: the loop is held, the request waits in the kernel)
            client.setblocking(False)
            answer = b""
            while not answer.partition(b"\r\n\r\n")[2]:  # until the body has come
                answer += await asyncio.wait_for(loop.sock_recv(client, 4096), 5)
        assert answer.startswith(b"HTTP/1.1 200")
        assert 0.25 <= float(answer.partition(b"\r\n\r\n")[2]) < 5
    finally:
        server.should_exit = True
        await serving
