"""Admission control: a bounded queue in front of the engine that says 429 before doing any work.

At most `max_in_flight` engine sequences run; up to `max_waiting` requests (holding at most
`max_waiting_prompt_tokens` prompt tokens) wait, first come first served, each for at most
`queue_timeout_s`. From the rate at which admitted requests complete, a new request's wait is
estimated; one that would wait past its queue deadline is refused at once, before it is even
tokenized, instead of being admitted to fail later.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from llmserve.config import AdmissionConfig
from llmserve.errors import OverloadedError

RATE_WINDOW_S = 30.0
MAX_RETRY_AFTER_S = 60


@dataclass
class _Waiter:
    cost: int
    prompt_tokens: int
    admitted: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class CompletionRate:
    """Completions per second over a sliding window: how fast the queue drains."""

    def __init__(self, clock: Callable[[], float], window_s: float = RATE_WINDOW_S) -> None:
        self._clock = clock
        self._window_s = window_s
        self._finished: deque[float] = deque()
        self._started_at = clock()

    def record(self) -> None:
        self._finished.append(self._clock())

    def per_second(self) -> float | None:
        now = self._clock()
        while self._finished and self._finished[0] < now - self._window_s:
            self._finished.popleft()
        if not self._finished:
            return None
        observed_for = min(self._window_s, now - self._started_at)
        return len(self._finished) / max(observed_for, 1.0)


class AdmissionQueue:
    def __init__(self, config: AdmissionConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.rate = CompletionRate(clock)
        self.running = 0
        self._waiting: deque[_Waiter] = deque()
        self._waiting_tokens = 0

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def estimated_wait_s(self, ahead: int | None = None) -> float | None:
        """How long a request joining the queue now would wait, from the observed drain rate."""
        if self.running < self.config.max_in_flight and not self._waiting:
            return 0.0
        rate = self.rate.per_second()
        if rate is None:
            return None
        return ((self.waiting if ahead is None else ahead) + 1) / rate

    def retry_after_s(self) -> int:
        wait = self.estimated_wait_s()
        seconds = self.config.queue_timeout_s if wait is None else wait
        return max(1, min(MAX_RETRY_AFTER_S, math.ceil(seconds)))

    def check_fast(self) -> None:
        """Refuse at once what cannot be served in time: before tokenizing, before queueing."""
        if not self.config.enabled:
            return
        must_wait = bool(self._waiting) or self.running >= self.config.max_in_flight
        if must_wait and self.waiting >= self.config.max_waiting:
            raise OverloadedError(
                "The server is at capacity: too many requests are waiting.", self.retry_after_s()
            )
        wait = self.estimated_wait_s()
        if self.config.shed_by_estimate and wait is not None and wait > self.config.queue_timeout_s:
            raise OverloadedError(
                f"The server is overloaded: a new request would wait about {wait:.1f} s "
                f"(limit {self.config.queue_timeout_s:g} s).",
                self.retry_after_s(),
            )

    async def admit(self, cost: int, prompt_tokens: int) -> None:
        """Wait for `cost` engine slots; raise OverloadedError if that cannot happen in time.

        A caller cancelled while waiting (client gone, deadline) leaves the queue; one cancelled
        just as it was admitted gives its slots back."""
        cost = min(cost, self.config.max_in_flight)
        if not self.config.enabled or (
            not self._waiting and self.running + cost <= self.config.max_in_flight
        ):
            self.running += cost
            return
        self.check_fast()
        if self._waiting_tokens + prompt_tokens > self.config.max_waiting_prompt_tokens:
            raise OverloadedError(
                "The server is at capacity: too many prompt tokens are waiting.", self.retry_after_s()
            )
        waiter = _Waiter(cost, prompt_tokens)
        self._waiting.append(waiter)
        self._waiting_tokens += prompt_tokens
        try:
            await asyncio.wait_for(asyncio.shield(waiter.admitted), self.config.queue_timeout_s)
        except TimeoutError:
            if waiter.admitted.done():
                return
            self._leave(waiter)
            raise OverloadedError(
                f"The request waited {self.config.queue_timeout_s:g} s without being admitted.",
                self.retry_after_s(),
            ) from None
        except BaseException:
            if waiter.admitted.done():
                self.release(cost, completed=False)
            else:
                self._leave(waiter)
            raise

    def _leave(self, waiter: _Waiter) -> None:
        self._waiting.remove(waiter)
        self._waiting_tokens -= waiter.prompt_tokens
        waiter.admitted.cancel()
        self._admit_waiters()

    def release(self, cost: int, completed: bool = True) -> None:
        self.running -= min(cost, self.config.max_in_flight)
        if completed:
            self.rate.record()
        self._admit_waiters()

    def _admit_waiters(self) -> None:
        while self._waiting and self.running + self._waiting[0].cost <= self.config.max_in_flight:
            waiter = self._waiting.popleft()
            self._waiting_tokens -= waiter.prompt_tokens
            self.running += waiter.cost
            waiter.admitted.set_result(None)
