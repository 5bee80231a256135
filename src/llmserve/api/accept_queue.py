"""The kernel's accept queue in front of the API process: connections the kernel has completed
that the event loop has not picked up yet.

When the API process saturates, requests wait there, up to the listen backlog (uvicorn's 2048
connections), where neither admission nor the event loop's lag sees them; clients time out in it,
and once it is full the kernel drops new connection attempts (a client retries its SYN after a
second). Linux tells its length for a listening socket through TCP_INFO: `tcpi_unacked` is the
connections queued, `tcpi_sacked` the backlog.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import NamedTuple

from llmserve.api.tcp_info import TcpSocket, is_measurable, tcp_info

__all__ = ["AcceptQueue", "accept_queue", "is_measurable"]

# struct tcp_info up to tcpi_sacked: eight u8 fields, then rto, ato, snd_mss, rcv_mss, unacked, sacked.
_TCP_INFO_PREFIX = struct.Struct("8B6I")
_TCP_LISTEN = 10  # tcpi_state of a listening socket


class AcceptQueue(NamedTuple):
    queued: int
    backlog: int


def accept_queue(sockets: Iterable[TcpSocket]) -> AcceptQueue:
    """The connections waiting to be accepted on `sockets`, and their backlogs, summed; sockets
    that do not tell (not TCP, not listening, not Linux) count nothing."""
    queued = backlog = 0
    for sock in sockets:
        fields = tcp_info(sock, _TCP_INFO_PREFIX)
        if fields is not None and fields[0] == _TCP_LISTEN:
            queued, backlog = queued + fields[-2], backlog + fields[-1]
    return AcceptQueue(queued, backlog)
