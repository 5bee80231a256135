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
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Protocol

from llmserve.errors import DrainingError, RequestTimeoutError, ServingError
from llmserve.policy.admission import Admission, Ticket
from llmserve.policy.rate_limits import KeyLimits, RateLimiter

if TYPE_CHECKING:
    from llmserve.engine.base import TokenTiming

ExpiryReason = Literal["timeout", "draining"]


@dataclass(frozen=True, slots=True)
class Cost:
    """What a planned request asks of the engine and of its key."""

    sequences: int
    prompt_tokens: int
    max_new_tokens: int  # over all its sequences
    # The prompt tokens its sequences hold in the KV cache: each of a prompt's n sequences its
    # prompt (None: one prompt, held by every sequence).
    kv_prompt_tokens: int | None = None

    @property
    def max_tokens_per_sequence(self) -> int:
        return self.max_new_tokens // max(1, self.sequences)


class Usage(Protocol):
    """Where the permit reads how many tokens a request generated, and tells how admission's
    prediction for it came out (the request's observation)."""

    @property
    def generated_tokens(self) -> int: ...

    def on_admission_outcome(
        self,
        queued: bool,
        predicted_s: float,
        actual_s: float,
        met_deadline: bool | None,
        wait: tuple[float, float] | None = None,
        at_risk: bool = False,
    ) -> None:
        """`wait`: a queued request's (forecast, real) wait for admission, in seconds; `at_risk`:
        admitted on the late-answer budget (policy/late_budget.py)."""
        ...


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
        key_id: str | None,
        key: KeyLimits | None,
        deadline: Deadline,
        usage: Usage,
        priority: int,
        read_delay_s: float = 0.0,
    ) -> None:
        self.route = route
        self.deadline = deadline
        self._permits = permits
        self._key_id = key_id
        self._key = key
        self._usage = usage
        self._priority = priority
        self._read_delay_s = read_delay_s
        self._cost: Cost | None = None
        self._ticket: Ticket | None = None  # admitted
        self._waiting: Ticket | None = None  # queued by admit_now, not yet waited for
        self._reserved_tokens = 0
        self._work_started = False
        self._handed_over = False
        self._last_token_at: dict[int, float] = {}
        self.released = False

    @property
    def _admission(self) -> Admission:
        return self._permits.admission

    def check_capacity(self, sequences: int, max_tokens: int | None) -> None:
        """Before planning: refuse at once (429) when the request, its prompt not yet counted
        (without max_tokens: one token), could not be served in time, so that a hopeless request
        costs no tokenizing. (With one token always, the check before planning refused none of a
        thousand requests refused at 3x and 4x overload: each was tokenized first.)"""
        probe = self._admission.ticket(
            sequences, 0, max_tokens or 1, self._key_id, self._priority, read_delay_s=self._read_delay_s
        )
        self._admission.check(probe)

    def reserve(self, cost: Cost) -> None:
        """Take the key's tokens for the planned request: prompt + every token it may generate."""
        self._cost = cost
        if self._key is not None:
            self._reserved_tokens = self._key.reserve_tokens(cost.prompt_tokens + cost.max_new_tokens)

    def admit_now(self) -> bool:
        """Without waiting: 429 if the request cannot be served in time, True if the engine has
        room for it now; False: it is queued, and `admit` waits for its turn."""
        assert self._cost is not None, "reserve() tells the permit what the request costs"
        cost = self._cost
        ticket = self._admission.ticket(
            cost.sequences,
            cost.prompt_tokens,
            cost.max_tokens_per_sequence,
            self._key_id,
            self._priority,
            kv_prompt_tokens=cost.kv_prompt_tokens,
            read_delay_s=self._read_delay_s,
        )
        if not self._admission.admit_now(ticket):
            self._waiting = ticket
            return False
        self._ticket = ticket
        return True

    async def admit(self) -> None:
        """Wait for the engine to have room for the request, within its deadline (429 if it
        cannot be served in time)."""
        if self._waiting is None and self.admit_now():
            return
        # From here admission takes the ticket out of its queue if the wait ends without room.
        ticket, self._waiting = self._waiting, None
        assert ticket is not None
        async with self.deadline.scope():
            await self._admission.wait_for_room(ticket)
        self._ticket = ticket

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

    # The engine's progress, as the request's generation observer: what admission learns from.

    def on_prompt(self, prompt_tokens: int) -> None:
        pass

    def on_tokens(self, choice: int, count: int, timing: TokenTiming | None = None) -> None:
        ticket = self._ticket
        if ticket is None or count <= 0:
            return
        now = time.monotonic()
        first_at, last_at = (now, now) if timing is None else timing.placed(now)
        ticket.generated += count
        model, batch = self._admission.model, self._admission.running
        previous = self._last_token_at.get(choice)
        if previous is not None:
            model.observe_step(batch, (last_at - previous) / count)
        else:
            if ticket.admitted_at is not None and not self._last_token_at:
                model.observe_prefill(ticket.prompt_tokens, first_at - ticket.admitted_at, batch)
            if timing is not None and count > 1:  # a choice delivered whole
                model.observe_step(batch, (last_at - first_at) / (count - 1))
        self._last_token_at[choice] = last_at

    def release(self, completed: bool) -> None:
        if self.released:
            raise RuntimeError("a permit is released exactly once")
        self.released = True
        self.deadline.cancel()
        if (ticket := self._ticket) is not None:
            self._admission.release(ticket, completed=completed)
            if ticket.predicted_e2e_s is not None and ticket.finished_at is not None:
                actual_s = ticket.finished_at - ticket.arrived_at
                met = None if ticket.deadline_at is None else ticket.finished_at <= ticket.deadline_at
                wait = None
                if ticket.forecast_wait_s is not None and ticket.queued and ticket.admitted_at is not None:
                    wait = (ticket.forecast_wait_s, ticket.admitted_at - ticket.arrived_at)
                self._usage.on_admission_outcome(
                    ticket.queued, ticket.predicted_e2e_s, actual_s, met, wait, ticket.at_risk
                )
        elif self._waiting is not None:  # queued, and cancelled before it could wait
            self._admission.withdraw(self._waiting)
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

    def __init__(self, admission: Admission, limiter: RateLimiter) -> None:
        self.admission = admission
        self._limiter = limiter
        self._held: set[Permit] = set()
        self._drain_at: float | None = None

    def issue(
        self,
        route: str,
        key_id: str | None,
        timeout_s: float,
        usage: Usage,
        priority: int = 0,
        read_delay_s: float = 0.0,
    ) -> Permit:
        """Take one request from the key (429 when it has none left) and start the deadline.
        `read_delay_s`: how long the request waited before the server read it."""
        key = self._limiter.limits_of(key_id)
        if key is not None:
            key.take_request()
        deadline = Deadline(timeout_s)
        if self._drain_at is not None:
            deadline.move_earlier(self._drain_at, "draining")
        permit = Permit(self, route, key_id, key, deadline, usage, priority, read_delay_s)
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
