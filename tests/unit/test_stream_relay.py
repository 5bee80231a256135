"""The SSE relay between a stream's producer task and the client, driven directly (no engine)."""

from __future__ import annotations

import asyncio

import pytest

from llmserve.api.generation import _relay
from llmserve.deadlines import DeadlineBook


async def test_a_client_leaving_mid_stream_leaves_no_task_behind() -> None:
    tasks_before = asyncio.all_tasks()
    queue: asyncio.Queue[bytes] = asyncio.Queue()

    async def produce() -> None:
        await queue.put(b"data: first\n\n")
        await asyncio.Event().wait()  # the engine is still generating

    producer = asyncio.create_task(produce())
    book = DeadlineBook()
    relay = _relay(queue, producer, book.start(producer, timeout_s=60), "cmpl-relay", None)
    assert await anext(relay) == b"data: first\n\n"
    waiting_for_more = asyncio.create_task(anext(relay))
    await asyncio.sleep(0.01)
    waiting_for_more.cancel()  # what the server does to the response when its client disconnects
    with pytest.raises(asyncio.CancelledError):
        await waiting_for_more
    await asyncio.sleep(0.01)
    assert producer.cancelled(), "the generation is stopped"
    assert len(book) == 0, "the request's deadline is released"
    left_pending = [task for task in asyncio.all_tasks() - tasks_before if not task.done()]
    assert left_pending == [], "no task left waiting on the queue (asyncio logs those as destroyed)"
