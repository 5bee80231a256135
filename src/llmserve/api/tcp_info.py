"""Linux's TCP_INFO for a socket, the one place it is read (api/accept_queue.py, api/read_delay.py)."""

from __future__ import annotations

import socket
import struct
from typing import Protocol


class TcpSocket(Protocol):
    def getsockopt(self, level: int, optname: int, buflen: int, /) -> bytes: ...


def is_measurable() -> bool:
    """Whether this OS reports TCP_INFO (Linux)."""
    return hasattr(socket, "TCP_INFO")


def tcp_info(sock: TcpSocket, layout: struct.Struct) -> tuple[int, ...] | None:
    """The leading fields of `sock`'s struct tcp_info, as `layout` describes them; None where the
    socket does not tell (not Linux, not TCP, already gone)."""
    if not is_measurable():
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, layout.size)
    except (AttributeError, OSError):
        return None
    if len(info) < layout.size:
        return None
    return layout.unpack_from(info)
