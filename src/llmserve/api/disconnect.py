"""Stop work for clients that have gone away."""

from __future__ import annotations

import asyncio
from typing import TypeVar

from fastapi import Request

T = TypeVar("T")


class ClientDisconnectedError(Exception):
    pass


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def cancel_on_disconnect(work_task: asyncio.Task[T], request: Request) -> T:
    """Await `work_task`; if the client disconnects first, cancel it (aborting its engine requests).

    A task cancelled by someone else (a deadline) raises CancelledError here."""
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({work_task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        work_task.cancel()
        raise
    finally:
        watcher.cancel()
    if not work_task.done():
        work_task.cancel()
        await asyncio.gather(work_task, return_exceptions=True)
        raise ClientDisconnectedError
    return work_task.result()
