"""What one request holds while it is served, taken step by step and released together, once.

A permit is issued when a request arrives: it takes one request from the caller's key and starts
the request's deadline. Planning tells it the request's cost; it then reserves the key's tokens and
waits for admission slots. It is released exactly once, whichever way the request ends: refused,
cancelled while queued or planning, finished, failed, cut by its deadline or by a drain. A request
refused before any work gives its key everything back; one that ran keeps what it used.

A JSON request's handler holds its permit in `async with`; a stream hands it over to the task that
produces the stream, which releases it when it ends. The set of held permits is the one count of
requests in flight: the gauge reads it and a drain waits for it to empty.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Protocol

from llmserve.errors import DrainingError, RequestTimeoutError, ServingError
from llmserve.policy.admission import AdmissionQueue
from llmserve.policy.rate_limits import KeyLimits, RateLimiter

ExpiryReason = Literal["timeout", "draining"]


@dataclass(frozen=True, slots=True)
class Cost:
    """What a planned request asks of the engine and of its key."""

    sequences: int
    prompt_tokens: int
    max_new_tokens: int


class Usage(Protocol):
    """Where the permit reads how many tokens a request generated (the request's observation)."""

    @property
    def generated_tokens(self) -> int: ...


class Deadline:
    """When a request must be done; a drain moves it earlier. When it passes, the waits it scopes
    end with its error and the tasks it guards are cancelled."""

    def __init__(self, timeout_s: float) -> None:
        self._loop = asyncio.get_running_loop()
        self.at = self._loop.time() + timeout_s
        self.reason: ExpiryReason = "timeout"
        self.expired: ExpiryReason | None = None
        self._guarded: set[asyncio.Task[Any]] = set()
        self._scopes: set[asyncio.Timeout] = set()
        self._timer = self._loop.call_at(self.at, self._expire)

    def move_earlier(self, at: float, reason: ExpiryReason) -> None:
        if at >= self.at or self.expired is not None:
            return
        self.at, self.reason = at, reason
        self._timer.cancel()
        self._timer = self._loop.call_at(at, self._expire)
        for scope in self._scopes:
            scope.reschedule(at)

    def _expire(self) -> None:
        self.expired = self.reason
        for task in self._guarded:
            task.cancel()

    def guard(self, task: asyncio.Task[Any]) -> None:
        """Cancel `task` when the deadline passes."""
        self._guarded.add(task)
        task.add_done_callback(self._guarded.discard)
        if self.expired is not None:
            task.cancel()

    @asynccontextmanager
    async def scope(self) -> AsyncIterator[None]:
        """Await within the deadline; past it, raise its error (504, or 503 when draining)."""
        try:
            async with asyncio.timeout_at(self.at) as timeout:
                self._scopes.add(timeout)
                try:
                    yield
                finally:
                    self._scopes.discard(timeout)
        except TimeoutError:
            self.expired = self.reason
            raise self.error() from None

    def error(self) -> ServingError:
        if self.reason == "draining":
            return DrainingError("The server is shutting down and could not finish this request.")
        return RequestTimeoutError()

    def cancel(self) -> None:
        self._timer.cancel()


class Permit:
    def __init__(
        self,
        permits: Permits,
        route: str,
        key: KeyLimits | None,
        deadline: Deadline,
        usage: Usage,
    ) -> None:
        self.route = route
        self.deadline = deadline
        self._permits = permits
        self._key = key
        self._usage = usage
        self._cost: Cost | None = None
        self._reserved_tokens = 0
        self._slots = 0
        self._work_started = False
        self._handed_over = False
        self.released = False

    def check_capacity(self) -> None:
        """Refuse at once what the admission queue cannot serve in time (before any work)."""
        self._permits.admission.check_fast()

    def reserve(self, cost: Cost) -> None:
        """Take the key's tokens for the planned request: prompt + every token it may generate."""
        self._cost = cost
        if self._key is not None:
            self._reserved_tokens = self._key.reserve_tokens(cost.prompt_tokens + cost.max_new_tokens)

    async def admit(self) -> None:
        """Wait for the request's admission slots, within its deadline."""
        assert self._cost is not None, "reserve() tells the permit what the request costs"
        async with self.deadline.scope():
            await self._permits.admission.admit(self._cost.sequences, self._cost.prompt_tokens)
        self._slots = self._cost.sequences

    def start(self) -> None:
        """The engine works for this request from now on: what it uses is no longer refunded."""
        self._work_started = True

    def hand_over(self, task: asyncio.Task[Any]) -> None:
        """`task` (a stream's producer) owns the permit: it runs within the deadline, and the permit
        is released when it ends, however it ends, even if it never got to run."""
        self._handed_over = True
        self.start()
        self.deadline.guard(task)
        task.add_done_callback(lambda done: self.release(completed=_succeeded(done)))

    def headers(self) -> dict[str, str]:
        return self._key.headers() if self._key is not None else {}

    def release(self, completed: bool) -> None:
        if self.released:
            raise RuntimeError("a permit is released exactly once")
        self.released = True
        self.deadline.cancel()
        if self._slots:
            self._permits.admission.release(self._slots, completed=completed)
        if self._key is not None:
            if self._work_started:
                assert self._cost is not None
                used = self._cost.prompt_tokens + self._usage.generated_tokens
                self._key.give_back_tokens(self._reserved_tokens - used)
            else:  # refused or abandoned before any work: it costs the key nothing
                self._key.give_back_request()
                self._key.give_back_tokens(self._reserved_tokens)
        self._permits.forget(self)

    async def __aenter__(self) -> Permit:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if not self._handed_over:
            self.release(completed=kind is None)


def _succeeded(task: asyncio.Task[Any]) -> bool:
    return not task.cancelled() and task.exception() is None


class Permits:
    """Issues permits and knows every one held: the requests in flight."""

    def __init__(self, admission: AdmissionQueue, limiter: RateLimiter) -> None:
        self.admission = admission
        self._limiter = limiter
        self._held: set[Permit] = set()
        self._drain_at: float | None = None

    def issue(self, route: str, key_id: str | None, timeout_s: float, usage: Usage) -> Permit:
        """Take one request from the key (429 when it has none left) and start the deadline."""
        key = self._limiter.limits_of(key_id)
        if key is not None:
            key.take_request()
        deadline = Deadline(timeout_s)
        if self._drain_at is not None:
            deadline.move_earlier(self._drain_at, "draining")
        permit = Permit(self, route, key, deadline, usage)
        self._held.add(permit)
        return permit

    def forget(self, permit: Permit) -> None:
        self._held.discard(permit)

    def in_flight(self, route: str | None = None) -> int:
        return sum(1 for permit in self._held if route is None or permit.route == route)

    def drain(self, timeout_s: float) -> None:
        """Every request in flight, and any that still arrives, must end within `timeout_s`."""
        self._drain_at = asyncio.get_running_loop().time() + timeout_s
        for permit in self._held:
            permit.deadline.move_earlier(self._drain_at, "draining")
