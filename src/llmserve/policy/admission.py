"""Admission: which requests the engine runs now, which wait, and which are refused at once.

A request is admitted when it fits: engine slots (`max_in_flight` sequences), the KV cache (its
prompt and the tokens it will likely generate, beside those of the running requests), and with
an SLO, time: at the batch it would join, its predicted time in the engine meets the targets,
and adding it pushes no running request that can still make its deadline past it. A request
that does not fit waits in a fair queue (priority, then fair across keys) if its predicted wait
leaves it time to meet its target (without an e2e target: to be admitted within
`queue_timeout_s`), with a margin steered by how the queued requests fared (policy/headroom.py);
otherwise it is refused at once, before any engine work, with 429 and a Retry-After of the
predicted time until it would fit. Predictions come from the ServiceModel,
which learns from every token the engine produces; there is always one.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import heapq
import math
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from llmserve.config import AdmissionConfig, SloConfig
from llmserve.errors import FrontEndOverloadedError, OverloadedError
from llmserve.policy.arrival_rate import ArrivalRate
from llmserve.policy.fair_queue import FairQueue
from llmserve.policy.headroom import Headroom
from llmserve.policy.late_budget import LateBudget
from llmserve.policy.loop_lag import EventLoopLag
from llmserve.policy.service_model import BatchLine, ServiceModel
from llmserve.policy.shared_state import EngineLoad

MAX_RETRY_AFTER_S = 60
# A finished request checks the prediction made at admission if the batch it ran with was within
# this factor of the batch that prediction planned on, either way.
RAN_AS_PLANNED = 0.8
KEPT_RUNNING_STEPS = 16  # iterations of Little's law for the batch arrivals keep running
# With a group of API processes, how often waiters look for room freed by the others.
GROUP_POLL_S = 0.005
MIN_WAIT_S = 0.01  # a queued request waits on only if its wait would end this much later
NOTABLE_READ_DELAY_S = 0.01  # a request's wait before the server read it, worth telling its client


@dataclass(eq=False)
class Ticket:
    """One request's claim on the engine, from the moment it asks until it is released."""

    sequences: int
    prompt_tokens: int  # once per prompt
    max_tokens: int  # per sequence
    kv_prompt_tokens: int = 0  # once per sequence: each holds its prompt in the KV cache
    key: str | None = None
    priority: int = 0
    arrived_at: float = 0.0  # when the server read it
    # How long it waited before that (api/read_delay.py): its client's clock, and so its latency
    # targets', started that much earlier.
    read_delay_s: float = 0.0
    expected_tokens: int = 0
    deadline_at: float | None = None  # None: no e2e promise (none configured, or not even alone)
    admitted_at: float | None = None
    queued: bool = False  # waited for room: its outcome steers the headroom
    at_risk: bool = False  # admitted from the queue on the late-answer budget (policy/late_budget.py)
    predicted_s: float = 0.0  # its time in the engine, as the model (uncorrected) predicted it
    planned_batch: int = 0  # the batch that prediction was made at
    planned_prompt_tokens: float = 0.0  # and the prompt tokens it planned each step to take in
    steps_mark: StepsMark | None = None  # the engine's steps so far, when it was admitted
    # When admission decided on it: its predicted wait for room (a queued request's), and its
    # predicted time from arrival to release, wait and service (corrected); None: none was made.
    forecast_wait_s: float | None = None
    predicted_e2e_s: float | None = None
    finished_at: float | None = None  # released after it completed
    generated: int = 0
    admitted: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())

    def remaining_tokens(self, now: float, step_s: float) -> int:
        """Tokens each of its sequences has yet to make: as counted from what was delivered, or
        as its time in the engine makes at `step_s` a token, whichever is further along (a
        response that is not streamed delivers nothing until it ends)."""
        done = self.generated // max(1, self.sequences)
        if self.admitted_at is not None and step_s > 0:
            done = max(done, int((now - self.admitted_at) / step_s))
        return max(1, self.expected_tokens - done)

    @property
    def kv_tokens(self) -> int:
        return self.kv_prompt_tokens + self.sequences * self.expected_tokens


@dataclass(frozen=True)
class StepsMark:
    steps: int
    batch_sum: int
    prompt_sum: int  # prompt tokens the steps took in


@dataclass(frozen=True)
class RanWith:
    """What the engine's steps were like over part of a request's life, on average."""

    batch: float
    prompt_tokens: float  # taken in by a step


class StepHistory:
    """The engine's steps: the batch a request really ran with, and the prompts its steps took in."""

    def __init__(self) -> None:
        self._now = StepsMark(0, 0, 0)

    def step(self, batch: int, prompt_tokens: int) -> None:
        now = self._now
        self._now = StepsMark(now.steps + 1, now.batch_sum + batch, now.prompt_sum + prompt_tokens)

    def mark(self) -> StepsMark:
        return self._now

    def since(self, mark: StepsMark) -> RanWith | None:
        steps = self._now.steps - mark.steps
        if steps <= 0:
            return None
        return RanWith(
            (self._now.batch_sum - mark.batch_sum) / steps, (self._now.prompt_sum - mark.prompt_sum) / steps
        )


class Admission:
    def __init__(
        self,
        config: AdmissionConfig,
        slo: SloConfig,
        model: ServiceModel | None = None,
        clock: Callable[[], float] = time.monotonic,
        load: EngineLoad | None = None,
        engine_sequences: int | None = None,
    ) -> None:
        """`engine_sequences`: the most the engine runs at once (vLLM's max_num_seqs), which
        queues the rest itself; None: unknown, nothing is kept ready beyond the batch limit."""
        self.config = config
        self._engine_sequences = engine_sequences
        self.slo = slo
        self.model = model or ServiceModel()
        self.kv_capacity_tokens: int | None = None  # set once the engine has told it
        self._clock = clock
        self._running: set[Ticket] = set()  # this process's
        # What the engine runs: this process's tickets, or with a group of API processes all of
        # theirs (policy/shared_state.py); then waiters also look for room freed by the others.
        self._load = load if load is not None else EngineLoad()
        self._in_group = load is not None
        self._poller: asyncio.TimerHandle | None = None
        self._waiting: FairQueue[Ticket] = FairQueue()
        self._waiting_prompt_tokens = 0  # of the queued tickets (each counts its prompts once)
        self._told_to_retry: list[float] = []  # when refused requests were told to come back
        self._steps = StepHistory()
        self._arrivals = ArrivalRate()  # of the requests admitted or queued (not probes)
        # A request waits only if its predicted wait is within this share of the time it has.
        self.headroom = Headroom(clock=clock)
        self.late_budget = LateBudget()
        self.loop_lag = EventLoopLag()
        self._max_loop_lag_s = config.max_loop_lag_s or (slo.e2e_s / 10 if slo.e2e_s else None)
        self._batch_limit: tuple[tuple[object, ...], int] | None = None  # (what it was found for, it)

    def observe_engine_step(self, seconds: float, engine_running: int | None, prompt_tokens: int) -> None:
        """A step timed by the engine itself (engine/step_stats.py): from then on the model learns
        step times from these rather than from the gaps between relayed tokens."""
        batch = engine_running if engine_running is not None else self.running
        self.model.observe_engine_step(batch, seconds, prompt_tokens)
        self._steps.step(batch, prompt_tokens)

    @property
    def running(self) -> int:
        """Engine sequences running (a request with n choices or prompts counts each)."""
        return self._load.sequences

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def ticket(
        self,
        sequences: int,
        prompt_tokens: int,
        max_tokens: int,
        key: str | None = None,
        priority: int = 0,
        kv_prompt_tokens: int | None = None,
        read_delay_s: float = 0.0,
    ) -> Ticket:
        """`prompt_tokens`: over its prompts, once each; `kv_prompt_tokens`: over its sequences,
        once each (None: one prompt, which every sequence holds); `read_delay_s`: how long it
        waited before the server read it."""
        now = self._clock()
        sequences = min(sequences, self.config.max_in_flight)
        ticket = Ticket(
            sequences=sequences,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            kv_prompt_tokens=sequences * prompt_tokens if kv_prompt_tokens is None else kv_prompt_tokens,
            key=key,
            priority=priority,
            arrived_at=now,
            read_delay_s=read_delay_s,
            expected_tokens=self.model.expected_tokens(max_tokens),
        )
        # Alone: its steps take in no other request's prompt. Judged with the prompts the steps
        # took in lately, under overload a quarter of the requests (56 of 251 at 2x on the CPU
        # engine) were "too long even alone", admitted with no deadline at all, and most came late.
        target = self.slo.e2e_s
        if (
            target is not None
            and self.model.service_s(prompt_tokens, ticket.expected_tokens, ticket.sequences, inflow=0.0)
            <= target
        ):
            ticket.deadline_at = now - read_delay_s + target
        if prompt_tokens > 0:  # not the probe before planning
            self.model.typical.observe(prompt_tokens, ticket.expected_tokens)
        return ticket

    def front_end_refusal(self) -> FrontEndOverloadedError | None:
        """While this API process's event loop runs too far behind (it is itself saturated), the
        refusal for any new request; else None. Call from the event loop."""
        if not self.config.enabled or self._max_loop_lag_s is None:
            return None
        self.loop_lag.watch(asyncio.get_running_loop())
        if self.loop_lag.lag_s <= self._max_loop_lag_s:
            return None
        return FrontEndOverloadedError(self.loop_lag.lag_s)

    def check(self, ticket: Ticket) -> None:
        """Refuse at once what cannot be served in time (429 with Retry-After)."""
        if not self.config.enabled:
            return
        if (refusal := self.front_end_refusal()) is not None:
            raise refusal
        if not self._waiting and self._fits(ticket, self._clock()):
            return
        if self.waiting >= self.config.max_waiting:
            raise self._refuse(ticket, "The server is at capacity: too many requests are waiting.")
        if self._waiting_prompt_tokens + ticket.prompt_tokens > self.config.max_waiting_prompt_tokens:
            raise self._refuse(ticket, "The server is at capacity: too many prompt tokens are waiting.")
        forecast, budget = self._forecast(ticket), self._wait_budget_s(ticket)
        wait = ticket.forecast_wait_s = forecast.wait_s()
        if self.config.shed_by_estimate and wait > self._allowed_wait_s(budget):
            cap = self.config.max_queue_wait_s
            if cap is not None and wait > cap and budget > 0:
                message = (
                    f"The server is overloaded: this request would wait about {wait:.1f} s, "
                    f"longer than the queue takes on ({cap:g} s)."
                )
            elif budget > 0:
                message = (
                    f"The server is overloaded: this request would wait about {wait:.1f} s, "
                    f"{self._budget_reason(ticket)} leaves {budget:.1f} s."
                )
            else:
                message = (
                    "The server is overloaded: at the batch this request would join it would not "
                    f"finish within {self._budget_reason(ticket)}."
                )
            raise self._refuse(ticket, message, forecast=forecast, budget_s=budget)

    async def admit(self, ticket: Ticket) -> None:
        """Run `ticket` now, or wait for room in the fair queue; raise OverloadedError when it
        cannot be served in time."""
        if not self.admit_now(ticket):
            await self.wait_for_room(ticket)

    def admit_now(self, ticket: Ticket) -> bool:
        """Without waiting: raise OverloadedError for what cannot be served in time, run what fits
        now (True), or put it in the fair queue (False: `wait_for_room` waits for its turn, and
        `withdraw` takes it out if the caller never waits). Synchronous, so that a refusal or an
        admission costs no turn of the event loop: under load each turn waits behind the streams'
        work (door refusals took 6 ms at the median and 17 ms at p99 for 0.4 ms of their own)."""
        # Unless refused it runs, and the batch it joins is planned with its own arrival counted,
        # so the door decides on the batch the queue will (not the probe before planning). Counted
        # only after the door, one arrival more could tip the rate, and the planned batch with it,
        # past the one the door allowed: the queue then refused it at once "after waiting", which
        # the headroom takes for a queued request's miss.
        counted = ticket.prompt_tokens > 0
        if counted:
            self._arrivals.arrive(ticket.arrived_at)
        try:
            self.check(ticket)
        except OverloadedError:
            if counted:
                self._arrivals.take_back()
            raise
        if not self._waiting and self._take(ticket, self._clock()):
            self._start(ticket)
            if self.config.enabled:  # the fit's prediction, at its planned batch, corrected
                ticket.predicted_e2e_s = ticket.predicted_s * self.model.correction
            return True
        ticket.queued = True
        if ticket.forecast_wait_s is not None:
            ticket.predicted_e2e_s = ticket.forecast_wait_s + self._service_s(ticket, self.planned_batch())
        self._waiting.push(ticket, ticket.key, ticket.sequences * ticket.expected_tokens, ticket.priority)
        self._waiting_prompt_tokens += ticket.prompt_tokens
        self._admit_waiters()
        if ticket.admitted.done():  # the queue moved at once: it runs, or was found too late
            ticket.admitted.result()  # raises its refusal
            return True
        if self._in_group and self._poller is None:
            self._poller = asyncio.get_running_loop().call_later(GROUP_POLL_S, self._poll_waiters)
        return False

    async def wait_for_room(self, ticket: Ticket) -> None:
        """Wait for the turn of a ticket `admit_now` queued; raise OverloadedError when it can no
        longer be served in time. A caller cancelled while waiting leaves the queue; one cancelled
        just as it was admitted gives its place back."""
        # When its wait runs out it is looked at again: the queue and the arrivals may have run
        # dry meanwhile, so that it now needs less time in the engine than when it began to wait.
        wait_until = -math.inf
        try:
            while not ticket.admitted.done():
                now, budget = self._clock(), self._wait_budget_s(ticket, slow=self._plans_on_tail(ticket))
                if now + budget < wait_until + MIN_WAIT_S:
                    self._leave(ticket)
                    raise self._refuse(
                        ticket,
                        f"The request waited {now - ticket.arrived_at:.1f} s without room to be "
                        "served in time.",
                        after_waiting=True,
                    )
                wait_until = now + max(budget, MIN_WAIT_S)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(ticket.admitted), wait_until - now)
            ticket.admitted.result()  # raises its refusal if the queue found it too late
        except OverloadedError:  # refused while waiting: it could no longer be served in time
            raise
        except BaseException:
            if ticket.admitted.done():
                self.release(ticket, completed=False)
            else:
                self._leave(ticket)
            raise

    def withdraw(self, ticket: Ticket) -> None:
        """Take back a ticket `admit_now` queued whose caller never waited for it (cancelled
        before it could): out of the queue, or its room given back if it was admitted meanwhile."""
        if not ticket.admitted.done():
            self._leave(ticket)
        elif ticket.admitted.cancelled() or ticket.admitted.exception() is not None:
            return  # it left the queue already (refused there: nobody is told)
        else:
            self.release(ticket, completed=False)

    def release(self, ticket: Ticket, completed: bool) -> None:
        if ticket in self._running:
            self._running.discard(ticket)
            self._load.give_back(ticket.sequences, ticket.kv_tokens)
            late = None
            if completed and ticket.admitted_at is not None:
                now = ticket.finished_at = self._clock()
                late = None if ticket.deadline_at is None else now > ticket.deadline_at
                self.model.observe_finish(ticket.generated // max(1, ticket.sequences), ticket.max_tokens)
                if self._ran_as_planned(ticket):
                    took_s = now - ticket.admitted_at
                    self.model.observe_service(ticket.predicted_s, took_s, ticket.expected_tokens)
                if ticket.queued and not ticket.at_risk:  # without an e2e deadline: admitted in time
                    self.headroom.observe(not late, queued_at=ticket.arrived_at)
            self.late_budget.finished(late, ticket.at_risk)
        self._admit_waiters()

    def _start(self, ticket: Ticket) -> None:
        """Run a ticket whose room `_take` took."""
        ticket.admitted_at = self._clock()
        # What the correction learns from: the fit alone (corrected, it learned its own error back)
        # at the batch admission plans on. Checked instead at the batch a request really ran
        # with, the time spent outside the engine's steps (the API process; at GPU rates most of
        # a request's time) became a factor on every prediction: x3 on the simulated H200,
        # refusing 30 % at half load.
        batch = self.planned_batch()  # at least those running, up to the batch the engine runs
        # `_service_s` uncorrected, its inflow kept: the prompt tokens its steps are planned to take in.
        model, line = self.model, self.model.at(batch, corrected=False)
        inflow = _step_inflow(line, ticket, self._inflow())
        ticket.predicted_s = line.service_s(ticket.prompt_tokens, ticket.expected_tokens, inflow)
        ticket.planned_prompt_tokens = model.step_prompt_tokens(batch, inflow)
        ticket.planned_batch, ticket.steps_mark = batch, self._steps.mark()
        if ticket.queued and ticket.deadline_at is not None:  # admitted with no time for a slow service
            slow_s = ticket.predicted_s * model.correction * model.tail_for(ticket.expected_tokens)
            ticket.at_risk = ticket.admitted_at + slow_s > ticket.deadline_at
            if ticket.at_risk:
                self.late_budget.take()
                # The queue's promise, time for a slow service, is broken as a refusal would have
                # broken it: the headroom learns the miss now. Learned only once the request came
                # late or not, a load's first misses cut the share seconds later, and meanwhile the
                # door queued more of its start (at 3x 27 refused after waiting in three runs, not 14).
                self.headroom.observe(met_target=False, queued_at=ticket.arrived_at)
        self._running.add(ticket)
        if not ticket.admitted.done():
            ticket.admitted.set_result(None)

    def _ran_as_planned(self, ticket: Ticket) -> bool:
        """Whether a finished request ran at about the batch its prediction was made at, its steps
        taking in about the prompts planned (where the engine times its steps; else taken as so).
        One that ran lighter, below the batch limit or in a drain, says nothing of the full batch:
        learned from, it made the correction halve predictions at light load and lower them after
        each drain, just before the next load. One that ran heavier says nothing of its planned
        batch either: the first requests of a load, planned at the few arrivals so far and then
        joined by the rest, took 1.7-2.3x their prediction, set the correction at 1.7, and the
        queue refused its heads after waiting. Nor does one whose steps took in more prompts than
        planned: as a load filled the engine, its first requests' steps took in the fill's prompts,
        twice the turnover planned (steps 30 % longer), and set the correction at 1.36 and the tail
        at 1.3 for the next seconds, refusing long requests the engine served in time."""
        ran = None if ticket.steps_mark is None else self._steps.since(ticket.steps_mark)
        if ran is None:
            return True
        planned = ticket.planned_batch
        if not RAN_AS_PLANNED * planned <= ran.batch <= planned / RAN_AS_PLANNED:
            return False
        model = self.model
        planned_step = model.step_with_prompts_s(planned, ticket.planned_prompt_tokens, corrected=False)
        step = model.step_with_prompts_s(planned, ran.prompt_tokens, corrected=False)
        return RAN_AS_PLANNED * planned_step <= step <= planned_step / RAN_AS_PLANNED

    def _leave(self, ticket: Ticket) -> None:
        self._waiting.remove(ticket)
        self._waiting_prompt_tokens -= ticket.prompt_tokens
        ticket.admitted.cancel()
        self._admit_waiters()

    def _admit_waiters(self) -> None:
        """Admit from the head of the queue while it fits. A head that can no longer make its e2e
        deadline at the batch running now is refused, rather than left to block those behind."""
        now = self._clock()
        while (head := self._waiting.peek()) is not None:
            if self._take(head, now):
                self._start(self._pop_waiting())
            elif self._too_late(head, now, self.planned_batch()):
                self._pop_waiting()
                head.admitted.set_exception(
                    self._refuse(
                        head,
                        "The request can no longer be served within its latency target.",
                        after_waiting=True,
                    )
                )
            else:
                return

    def _pop_waiting(self) -> Ticket:
        ticket = self._waiting.pop()
        self._waiting_prompt_tokens -= ticket.prompt_tokens
        return ticket

    def _poll_waiters(self) -> None:
        """In a group, room freed by another API process wakes nobody here: look again shortly."""
        self._poller = None
        self._admit_waiters()
        if self._waiting:
            self._poller = asyncio.get_running_loop().call_later(GROUP_POLL_S, self._poll_waiters)

    # The predictions.

    def _service_s(self, ticket: Ticket, batch: int, corrected: bool = True, slow: bool = False) -> float:
        """Its time in the engine at `batch`, its steps taking in no more prompts than the queue
        and the arrivals bring over that time. `slow`: as a slow request of the same prediction
        takes it (the model's tail), what a request that waited plans on: see `_too_late`."""
        service_s = _service_on(self.model.at(batch, corrected), ticket, self._inflow())
        return service_s * self.model.tail_for(ticket.expected_tokens) if slow else service_s

    def _inflow(self) -> Inflow | None:
        """What the engine's steps can take in from now: the prompt tokens queued and those
        arriving at the current rate. A burst's queue drains at the end: predicted at a batch that
        keeps turning over, its last requests were planned at 2x the steps they ran (each step
        taking in a typical request's prompt per 1/T of the batch), and 20 of 230 that would have
        made the SLO were refused after waiting. None in a group of API processes: each sees only
        its own queue and arrivals (and no inflow is worth the service time it is found over)."""
        if self._in_group:
            return None
        return Inflow(self._waiting_prompt_tokens, self._arrival_rate() * self.model.typical.prompt_tokens)

    def _fits(self, ticket: Ticket, now: float) -> bool:
        """Room now: slots and KV for it within the batch limit, and time to finish by its
        deadline even once the batch has grown to that limit. Alone it is served, whatever its
        targets."""
        return self._room(ticket, now, self._load.has_room)

    def _take(self, ticket: Ticket, now: float) -> bool:
        """Take the room `_fits` describes, checked again as it is taken: another API process
        of the group may have taken it since anyone looked."""
        return self._room(ticket, now, self._load.try_take)

    def _room(self, ticket: Ticket, now: float, claim: Callable[[int, int, int, int | None], bool]) -> bool:
        if not self.config.enabled:
            return claim(ticket.sequences, ticket.kv_tokens, sys.maxsize, None)
        limit = self.batch_limit()
        if self.running > 0 and self._too_late(ticket, now, self.planned_batch(limit)):
            return False
        most = limit + self.ready_reserve(limit)
        return claim(ticket.sequences, ticket.kv_tokens, most, self.kv_capacity_tokens)

    def ready_reserve(self, limit: int) -> int:
        """Sequences admitted beyond the batch limit, kept ready in vLLM's own waiting queue so
        that a slot a finished request frees is filled at the engine's next step:
        `admission.ready_steps` steps' worth of the batch's turnover. Admitted only once a slot
        was free, the next request reached the engine a step or more after it (the API process
        takes the output, releases the permit, admits and sends the next), the engine ran 60 of
        64 under a queue, and at 1.5x load 195-201 of 240 requests were answered in time against
        237-240 with 4 kept ready. Only where the limit is the engine's own: below it vLLM would
        run them at once."""
        if self._engine_sequences is None or limit < self._engine_sequences:
            return 0
        turnover = limit / max(1, self.model.typical.tokens)  # sequences finishing per step
        return min(limit, math.ceil(self.config.ready_steps * turnover))

    def _too_late(self, ticket: Ticket, now: float, limit: int) -> bool:
        """Whether it would miss its deadline at `limit`. A request that waited plans on a slow
        service (the model's tail), as its wait budget did: it is admitted from the queue only
        with that margin, or refused. Planned on the median, queued requests reached the engine
        with little time left and a tenth of them took 1.2-1.3x their prediction: at 4x load up
        to 23 came late, most of them queued at a load's start. Under overload, what such a
        request leaves is taken by another with time to spare; a request that can run at once
        plans on the median, so that a long one is not refused at light load. So does a queued
        request while the late-answer budget has room: admitted at risk, not refused seconds late."""
        deadline = ticket.deadline_at
        if deadline is None:
            return False
        return now + self._service_s(ticket, limit, slow=self._plans_on_tail(ticket)) > deadline

    def _plans_on_tail(self, ticket: Ticket) -> bool:
        """Whether it needs time for a slow service: queued, and the late-answer budget spent."""
        return ticket.queued and not self.late_budget.has_room()

    def batch_limit(self) -> int:
        """The largest batch at which a typical request of the current traffic meets the targets:
        the engine runs that full, so every admitted request can plan on it. Found again only once
        the model has changed: one admission asks for it up to four times."""
        slo, most = self.slo, self.config.max_in_flight
        if slo.e2e_s is None and slo.tpot_s is None and slo.ttft_s is None:
            return most
        inputs = (id(self.model), self.model.revision, slo.e2e_s, slo.tpot_s, slo.ttft_s, most)
        if self._batch_limit is None or self._batch_limit[0] != inputs:
            self._batch_limit = (inputs, self._find_batch_limit(most))
        return self._batch_limit[1]

    def _find_batch_limit(self, most: int) -> int:
        slo = self.slo
        prompt_tokens = self.model.typical.prompt_tokens

        def late(batch: int) -> bool:
            return self._too_slow_per_token(prompt_tokens, batch) or (
                slo.e2e_s is not None and self.model.typical_service_s(batch) > slo.e2e_s
            )

        # A step never gets shorter with more sequences running (the model's slope is >= 0), so
        # `late` turns true once as the batch grows: find that batch by bisection (runs per request).
        low, high = 1, most + 1
        while low < high:
            middle = (low + high) // 2
            low, high = (low, middle) if late(middle) else (middle + 1, high)
        return most if low > most else max(1, low - 1)

    def planned_batch(self, limit: int | None = None) -> int:
        """The batch a request admitted now plans to share: the batch limit, or, while arrivals
        are too few to fill it, the batch they keep running (never below what runs now). Planned
        at the limit, a request that ran at a fifth of it on the simulated H200 was refused at half
        load for being late "once the batch has grown to the limit", which it never did. In a
        group of API processes, each sees only its own arrivals: the limit.

        The batch kept running is Little's law, N = rate x service(N), where the rate counts the
        requests admitted or queued (those refused never run) and the service is at N itself, not
        at the limit. With the refused counted, or the service at the limit, an overestimate of
        the service locked itself in: every request was planned at a batch of 50, only the
        shortest fitted, the engine ran 5, and no request ran at its planned batch to correct it."""
        limit = self.batch_limit() if limit is None else limit
        if self._in_group:
            return limit
        rate = self._arrival_rate()
        # From the limit down to the largest batch that keeps itself running (service grows with
        # the batch, so each step shrinks it; it settles within a few).
        kept_running = limit
        for _ in range(KEPT_RUNNING_STEPS):
            smaller = max(1, math.ceil(rate * self.model.typical_service_s(kept_running)))
            if smaller >= kept_running:
                break
            kept_running = smaller
        return max(1, min(limit, max(self.running, kept_running)))

    def _arrival_rate(self) -> float:
        """Requests admitted or queued per second (policy/arrival_rate.py): steady over the last
        10 s, or over the last 2 s where those say the load changed; from the first of them at the
        start of a load, so that the idle spell before it is not averaged in (its first requests,
        planned at the 4 or 9 the arrivals so far kept running, ran at 50 and missed the SLO by
        1-2 s)."""
        return self._arrivals.per_second(self._clock())

    def _too_slow_per_token(self, prompt_tokens: int, batch: int) -> bool:
        """At `batch`, a step would exceed the TPOT target, or prefill and a step the TTFT target."""
        step = self.model.step_s(batch)
        if self.slo.tpot_s is not None and step > self.slo.tpot_s:
            return True
        ttft = self.slo.ttft_s
        return ttft is not None and self.model.prefill_s(prompt_tokens) + step > ttft

    def _forecast(self, ticket: Ticket) -> QueueForecast:
        """What `ticket`'s wait is predicted from, taken once for a decision: a refusal asks it
        for up to three waits (the door's, the Retry-After's, the waiting room's), and taken for
        each of them it was 37 % of the API process's time at 4x overload."""
        now = self._clock()
        limit = max(self.batch_limit(), ticket.sequences)
        batch = max(1, min(self.running, limit))  # the engine runs no more: the rest are kept ready
        inflow = self._inflow()
        typical_inflow = (
            None
            if inflow is None
            else inflow.per_step(self.model.typical_service_s(batch), self.model.typical.tokens)
        )
        step = self.model.step_s(batch, inflow=typical_inflow)
        # In a group this process sees only its own running tickets: each stands for its share
        # of the engine's batch (the others' run alike).
        own = sum(t.sequences for t in self._running)
        share = self.running / own if own else 1.0
        finishing = [(now + t.remaining_tokens(now, step) * step, t.sequences * share) for t in self._running]
        heapq.heapify(finishing)
        waiting = (t for t in self._waiting.ahead_of(ticket) if t is not ticket)
        line = self.model.at(limit)
        return QueueForecast(
            now=now,
            limit=limit,
            running=self.running,
            sequences=ticket.sequences,
            finishing=finishing,
            ahead=[(t.sequences, _service_on(line, t, inflow)) for t in waiting],
            typical_s=self.model.typical_service_s(limit),
        )

    def _wait_budget_s(self, ticket: Ticket, slow: bool = True) -> float:
        """How long it may wait: until it would miss its e2e deadline (`slow`: served as slowly
        as the model's tail) or its TTFT target, else until queue_timeout_s."""
        now, limit = self._clock(), self.planned_batch()
        budgets = []
        if ticket.deadline_at is not None:
            budgets.append(ticket.deadline_at - now - self._service_s(ticket, limit, slow=slow))
        if self.slo.ttft_s is not None:
            first_token_s = self.model.prefill_s(ticket.prompt_tokens) + self.model.step_s(limit)
            budgets.append(ticket.arrived_at - ticket.read_delay_s + self.slo.ttft_s - now - first_token_s)
        if not budgets:
            budgets.append(self.config.queue_timeout_s - (now - ticket.arrived_at))
        return min(budgets)

    def _allowed_wait_s(self, budget_s: float) -> float:
        """The longest forecast wait the door queues a request for: the headroom's share of its
        budget, and at most `admission.max_queue_wait_s`. A queue that stands seconds deep exposes
        each request in it to the model's moves while it waits (a load's ramp raises every
        prediction at once), and the ones left without time are refused after waiting, seconds
        late; capped, more are refused at the door, in milliseconds, and fewer of a burst wait."""
        allowed = self.headroom.share * budget_s
        cap = self.config.max_queue_wait_s
        return allowed if cap is None else min(allowed, cap)

    def _budget_reason(self, ticket: Ticket) -> str:
        if ticket.deadline_at is None and self.slo.ttft_s is None:
            return "the queue deadline"
        if ticket.read_delay_s < NOTABLE_READ_DELAY_S:
            return "its latency target"
        return f"its latency target (it waited {ticket.read_delay_s:.2f} s before the server could read it)"

    def _refuse(
        self,
        ticket: Ticket,
        message: str,
        after_waiting: bool = False,
        forecast: QueueForecast | None = None,
        budget_s: float | None = None,
    ) -> OverloadedError:
        """429 with a Retry-After of when there should be room for it, behind those waiting and
        those refused before it that were told to come back (so a refused burst comes back spread
        out, not as one herd): when the waiting room has a place, and waiting then leaves it time.
        A queued request refused after waiting is a miss the headroom learns from. `forecast` and
        `budget_s`: as the caller took them for this decision, if it did."""
        if after_waiting:
            self.headroom.observe(met_target=False, queued_at=ticket.arrived_at)
        now = self._clock()
        while self._told_to_retry and self._told_to_retry[0] <= now:
            self._told_to_retry.pop(0)
        position = self.waiting + len(self._told_to_retry)
        forecast = forecast or self._forecast(ticket)
        admitted_at = forecast.wait_s(position)
        beyond_room = position - self.config.max_waiting  # places ahead beyond the waiting room's
        room_at = forecast.wait_s(beyond_room) if beyond_room >= 0 else 0.0
        budget_s = self._wait_budget_s(ticket) if budget_s is None else budget_s
        allowed = self._allowed_wait_s(max(0.0, budget_s))
        retry_after = _seconds(max(room_at, admitted_at - allowed))
        bisect.insort(self._told_to_retry, now + retry_after)
        return OverloadedError(message, retry_after, after_waiting)


@dataclass(frozen=True)
class Inflow:
    """The prompt tokens the engine's steps can take in from now: queued, and arriving."""

    queued_tokens: int
    arriving_per_s: float

    def per_step(self, seconds: float, steps: int, own_queued: int = 0) -> float:
        """Per step over the next `seconds` (`steps` steps), less `own_queued` of those queued."""
        return (max(0, self.queued_tokens - own_queued) + self.arriving_per_s * seconds) / max(1, steps)


@dataclass(frozen=True)
class QueueForecast:
    """When a ticket would be admitted: the running requests finish at their predicted times and
    those queued ahead of it take the freed slots first, each then running for its service time."""

    now: float
    limit: int  # the batch the engine runs
    running: float
    sequences: int  # the ticket's
    finishing: list[tuple[float, float]]  # (when, sequences freed) of those running: a heap
    ahead: list[tuple[int, float]]  # (sequences, service s) of those queued ahead of it, in order
    typical_s: float  # a typical request's service at the limit

    def wait_s(self, position: int | None = None) -> float:
        """Seconds until it would be admitted. `position`: as if that many were ahead (more than
        are waiting: typical requests; not others like it, which for the one-token probe before
        planning told a refused burst to come back all at once)."""
        limit, running = self.limit, self.running
        finishing = self.finishing.copy()  # still a heap
        ahead = deque(self.ahead)
        beyond_s = 0.0
        if position is not None:
            # Far back, each `limit` more ahead add one service time: a batch of them is simulated,
            # the rest counted (four batches took 40 % longer a refusal, and in a run of 1399
            # refusals changed 102 Retry-Afters, by -1 to +3 s).
            simulated = min(position, len(ahead) + limit)
            beyond_s = (position - simulated) / limit * self.typical_s
            while len(ahead) > simulated:
                ahead.pop()
            ahead.extend([(1, self.typical_s)] * (simulated - len(ahead)))
        # Refusals run this for the Retry-After of a few hundred places: a heap, not a list sorted
        # again at each place (that was a quarter of the API process's time at 4x overload).
        time_now = self.now
        while True:
            while ahead and running + ahead[0][0] <= limit:
                sequences, service_s = ahead.popleft()
                running += sequences
                heapq.heappush(finishing, (time_now + service_s, sequences))
            if (not ahead and (running == 0 or running + self.sequences <= limit)) or not finishing:
                return time_now - self.now + beyond_s
            time_now, freed = heapq.heappop(finishing)
            running -= freed


def _service_on(line: BatchLine, ticket: Ticket, inflow: Inflow | None) -> float:
    """`ticket`'s time in the engine at `line`'s batch, its steps taking in what `inflow` brings
    (see `Admission._service_s`): the model at the batch and the inflow taken once for many
    tickets, as `_forecast` asks it for every queued one."""
    return line.service_s(ticket.prompt_tokens, ticket.expected_tokens, _step_inflow(line, ticket, inflow))


def _step_inflow(line: BatchLine, ticket: Ticket, inflow: Inflow | None) -> float | None:
    """The most prompt tokens a step of `ticket`'s time in the engine (at `line`'s batch) can take
    in: what `inflow` brings over its time turning over, less its own prompt if it is queued (its
    prefill is counted apart)."""
    if inflow is None:
        return None
    prompt_tokens, tokens = ticket.prompt_tokens, ticket.expected_tokens
    own = prompt_tokens if ticket.queued and not ticket.admitted.done() else 0
    return inflow.per_step(line.service_s(prompt_tokens, tokens), tokens, own)


def _seconds(wait_s: float) -> int:
    return max(1, min(MAX_RETRY_AFTER_S, math.ceil(wait_s)))
