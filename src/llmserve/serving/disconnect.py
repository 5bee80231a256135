"""Stop work for clients that have gone away."""

from __future__ import annotations

import asyncio
from typing import TypeVar

from starlette.requests import Request

T = TypeVar("T")


class ClientDisconnectedError(Exception):
    """The client left before its answer: nothing is sent (499 in the metrics and the log)."""


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def cancel_on_disconnect(work: asyncio.Task[T], request: Request) -> T:
    """Await `work`; if the client disconnects first, cancel it (aborting its engine requests or
    taking it out of the queue) and raise ClientDisconnectedError. If the caller is cancelled (a
    deadline), the work is cancelled too. Either way the work has ended when this returns."""
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not work.done():
            work.cancel()
            await asyncio.wait({work})
    if work.cancelled() and watcher.done() and not watcher.cancelled():
        raise ClientDisconnectedError
    return work.result()
