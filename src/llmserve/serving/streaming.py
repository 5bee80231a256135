"""Server-sent events framing shared by every streaming endpoint."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import aclosing
from typing import TypeVar

from pydantic import BaseModel

DONE_EVENT = b"data: [DONE]\n\n"
T = TypeVar("T")


def sse_event(payload: BaseModel) -> bytes:
    return b"data: " + payload.model_dump_json(exclude_none=False).encode() + b"\n\n"


async def merge_async_iterators(
    iterators: Sequence[AsyncGenerator[T, None]],
) -> AsyncIterator[tuple[int, T]]:
    """Yield (source index, item) as items arrive from any iterator; close all on exit."""
    if len(iterators) == 1:
        async with aclosing(iterators[0]) as only:
            async for item in only:
                yield 0, item
        return
    queue: asyncio.Queue[tuple[int, T] | None] = asyncio.Queue()
    failures: list[BaseException] = []

    async def pump(index: int, iterator: AsyncGenerator[T, None]) -> None:
        try:
            async with aclosing(iterator) as items:
                async for item in items:
                    await queue.put((index, item))
        except Exception as exc:  # handed to the consumer, which re-raises it
            failures.append(exc)
        finally:
            await queue.put(None)

    tasks = [asyncio.create_task(pump(i, it)) for i, it in enumerate(iterators)]
    try:
        remaining = len(tasks)
        while remaining:
            entry = await queue.get()
            if failures:
                raise failures[0]
            if entry is None:
                remaining -= 1
                continue
            yield entry
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
