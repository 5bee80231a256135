"""The kernel's accept queue, read from a listening socket: how many connections wait there
before the API process picks them up (Linux only), and the backlog that bounds it."""

from __future__ import annotations

import socket
import time

import pytest

from llmserve.api.accept_queue import AcceptQueue, accept_queue, is_measurable

pytestmark = pytest.mark.skipif(not is_measurable(), reason="TCP_INFO is Linux's")


def test_connections_not_yet_accepted_are_counted_and_leave_the_queue_when_accepted() -> None:
    with socket.create_server(("127.0.0.1", 0), backlog=8) as listening:
        assert accept_queue([listening]) == AcceptQueue(queued=0, backlog=8)
        clients = [socket.create_connection(listening.getsockname()) for _ in range(3)]
        try:
            deadline = time.monotonic() + 5
            while accept_queue([listening]).queued < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert accept_queue([listening]) == AcceptQueue(queued=3, backlog=8)
            accepted, _ = listening.accept()
            accepted.close()
            assert accept_queue([listening]).queued == 2
        finally:
            for client in clients:
                client.close()


def test_sockets_that_are_not_listening_count_nothing() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp, socket.socket() as unbound:
        assert accept_queue([udp, unbound]) == AcceptQueue(queued=0, backlog=0)
    assert accept_queue([]) == AcceptQueue(queued=0, backlog=0)
