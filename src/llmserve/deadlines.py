"""Deadlines for in-flight requests: a request's work is cancelled when its deadline passes.

Cancelling the work task aborts its engine requests (the engine adapter aborts on cancellation).
A drain moves every deadline to the drain deadline if that is earlier, so nothing admitted
outlives the drain and nothing is dropped without an answer.
"""

from __future__ import annotations

import asyncio
from typing import Literal

ExpiryReason = Literal["timeout", "draining"]


class RequestDeadline:
    def __init__(self, book: DeadlineBook, work: asyncio.Task[object], timeout_s: float) -> None:
        self._book = book
        self._work = work
        self._loop = asyncio.get_running_loop()
        self.at = self._loop.time() + timeout_s
        self.expired: ExpiryReason | None = None
        self._handle = self._loop.call_at(self.at, self._expire, "timeout")

    def move_earlier(self, at: float, reason: ExpiryReason) -> None:
        if at >= self.at or self.expired is not None:
            return
        self._handle.cancel()
        self.at = at
        self._handle = self._loop.call_at(at, self._expire, reason)

    def _expire(self, reason: ExpiryReason) -> None:
        if not self._work.done():
            self.expired = reason
            self._work.cancel()

    def release(self) -> None:
        self._handle.cancel()
        self._book.release(self)


class DeadlineBook:
    """Every in-flight generation request's deadline; its size is the in-flight count."""

    def __init__(self) -> None:
        self._deadlines: set[RequestDeadline] = set()
        self._drain_at: float | None = None

    def __len__(self) -> int:
        return len(self._deadlines)

    def start(self, work: asyncio.Task[object], timeout_s: float) -> RequestDeadline:
        deadline = RequestDeadline(self, work, timeout_s)
        if self._drain_at is not None:
            deadline.move_earlier(self._drain_at, "draining")
        self._deadlines.add(deadline)
        return deadline

    def release(self, deadline: RequestDeadline) -> None:
        self._deadlines.discard(deadline)

    def drain(self, timeout_s: float) -> None:
        self._drain_at = asyncio.get_running_loop().time() + timeout_s
        for deadline in list(self._deadlines):
            deadline.move_earlier(self._drain_at, "draining")
