"""How long a request waited in this host's kernel before the API process read it.

A new connection waits in the accept queue until the event loop picks it up, and a request on an
open connection waits in the socket's buffer while the loop is busy elsewhere. The client's clock
runs through both, but the server's clocks (and admission's deadlines) start only when it reads
the request: when the API process saturates, requests can wait there longer than their whole
latency target, then be served to clients that have given up.

Linux tells the wait per connection: TCP_INFO's `tcpi_last_data_recv`, the milliseconds since
the last segment arrived (its resolution is the kernel's tick). A request spread over several
segments is measured from its last, so the reading never exceeds the real wait.
"""

from __future__ import annotations

import asyncio
import struct

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from llmserve.api.tcp_info import TcpSocket, tcp_info

# struct tcp_info up to tcpi_last_data_recv: eight u8 fields, then rto, ato, snd_mss, rcv_mss,
# unacked, sacked, lost, retrans, fackets, last_data_sent, last_ack_sent, last_data_recv.
_TCP_INFO_TO_LAST_DATA_RECV = struct.Struct("8B12I")
# Where the request's reading goes: the ASGI scope's per-request state.
READ_DELAY_KEY = "read_delay_s"


def read_delay_s(sock: TcpSocket | None) -> float:
    """Seconds since the last data arrived on `sock`; 0 where the OS does not tell (not Linux,
    not TCP, a socket already gone)."""
    fields = None if sock is None else tcp_info(sock, _TCP_INFO_TO_LAST_DATA_RECV)
    return 0.0 if fields is None else fields[-1] / 1000


class ReadDelayHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, which also puts each request's read delay in its scope's
    state (uvicorn hands the app neither the socket nor the transport)."""

    _socket: TcpSocket | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._socket = transport.get_extra_info("socket")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope["state"][READ_DELAY_KEY] = read_delay_s(self._socket)
