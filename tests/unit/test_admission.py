"""Admission: run now, wait in a fair queue, or refuse at once, from predictions that always exist."""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
from fastapi import FastAPI
from hypothesis import given, settings
from hypothesis import strategies as st
from loadtest.prom import Scrape

from llmserve.app import create_app
from llmserve.config import AdmissionConfig, SloConfig, load_config, parse_overrides
from llmserve.engine.base import SamplingSpec, TokenizedPrompt
from llmserve.errors import OverloadedError
from llmserve.policy.admission import Admission, Ticket
from llmserve.policy.headroom import START_SHARE
from llmserve.policy.late_budget import LateBudget
from llmserve.policy.permits import Cost
from llmserve.policy.service_model import ServiceModel
from llmserve.serving.generation import PlannedPrompt, cost_of
from tests.fake_engine import FakeEngine, fake_starter
from tests.unit.conftest import MODEL


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def known_model(base_s: float = 0.1, per_sequence_s: float = 0.01) -> ServiceModel:
    """A model that has seen steps of exactly base + per_sequence * batch, and no prefill cost."""
    model = ServiceModel()
    for batch in (1, 9, 1, 9):
        model.observe_step(batch, base_s + per_sequence_s * batch)
    for _ in range(3):
        model.observe_prefill(100, model.step_s(1), 1)
    return model


def admission(
    clock: FakeClock | None = None,
    slo: SloConfig | None = None,
    model: ServiceModel | None = None,
    **limits: object,
) -> Admission:
    settings = {"max_in_flight": 2, "max_waiting": 2, "queue_timeout_s": 0.5, **limits}
    return Admission(
        AdmissionConfig.model_validate(settings),
        slo or SloConfig(),
        model or known_model(),
        clock or FakeClock(),
    )


async def run(queue: Admission, sequences: int = 1, max_tokens: int = 10, **fields: object) -> Ticket:
    ticket = queue.ticket(sequences, 10, max_tokens, **fields)  # type: ignore[arg-type]
    await queue.admit(ticket)
    return ticket


def test_the_model_learns_a_line_of_step_time_over_batch_size() -> None:
    model = known_model(0.1, 0.01)
    assert model.step_s(1) == pytest.approx(0.11)
    assert model.step_s(33) == pytest.approx(0.43)
    assert model.prefill_s(100) == pytest.approx(0.0, abs=1e-6)


def test_a_fresh_model_still_predicts_and_learns_what_share_of_max_tokens_is_used() -> None:
    model = ServiceModel()
    assert model.step_s(8) > 0, "never 'no estimate', even before any request"
    assert model.expected_tokens(100) == 100, "until requests have finished, max_tokens"
    for _ in range(20):
        model.observe_finish(25, 100)
    assert model.expected_tokens(100) == 25
    assert model.expected_tokens(8) == 2


def test_predictions_are_corrected_by_what_requests_really_took() -> None:
    model = known_model(0.1, 0.01)
    predicted = model.service_s(0, 10, 1)
    for _ in range(20):
        model.observe_service(predicted_s=predicted, actual_s=1.5 * predicted, tokens=10)
    assert model.correction == pytest.approx(1.5)
    assert model.service_s(0, 10, 1) == pytest.approx(1.5 * predicted)
    for _ in range(200):  # the engine got faster: the old errors fade out of the window
        model.observe_service(predicted_s=1.0, actual_s=0.8, tokens=10)
    assert model.correction == pytest.approx(0.8)


def model_with_a_slow_tenth(slow: float = 1.5) -> ServiceModel:
    """The known model, having seen 9 requests in 10 take what it predicted and 1 `slow` x that."""
    model = known_model(0.1, 0.01)
    for index in range(20):
        model.observe_service(predicted_s=1.0, actual_s=slow if index % 10 == 9 else 1.0, tokens=8)
    return model


def test_the_model_knows_how_much_longer_than_predicted_a_slow_request_takes() -> None:
    model = model_with_a_slow_tenth(1.5)
    assert model.correction == pytest.approx(1.0)  # the median: predictions stay unbiased
    assert model.tail == pytest.approx(1.5)  # the 90th percentile over the median
    assert ServiceModel().tail == 1.0  # nothing seen yet: no margin


def model_with_spreads(short_slow: float, long_slow: float) -> ServiceModel:
    """The known model, having seen 100 requests of 4 tokens, a fifth of them taking `short_slow` x
    their prediction, and 100 of 10 tokens, a tenth of them `long_slow` x (the rest as predicted)."""
    model = known_model(0.1, 0.01)
    for index in range(100):
        model.observe_service(
            predicted_s=0.4, actual_s=0.4 * (short_slow if index % 5 == 4 else 1.0), tokens=4
        )
        model.observe_service(predicted_s=1.0, actual_s=long_slow if index % 10 == 9 else 1.0, tokens=10)
    return model


def test_a_request_plans_on_the_spread_of_requests_of_about_its_length() -> None:
    """A long request averages its steps' noise over more of them: on the CPU engine the 90th
    percentile over the median was 1.26 for 12-23 tokens and 1.08 for 36-48 (float32, at 1x)."""
    model = model_with_spreads(short_slow=1.6, long_slow=1.1)
    assert model.correction == pytest.approx(1.0)
    assert model.tail == pytest.approx(1.6)  # over all, the short requests' slow fifth
    assert model.tail_for(4) == pytest.approx(1.6)
    assert model.tail_for(10) == pytest.approx(1.1)  # within 1.5x of its length: only the long
    assert model.tail_for(6) == pytest.approx(1.6)  # 4 is near enough, 10 too far
    assert model.tail_for(100) == model.tail  # none of its length yet: the spread of all


async def a_waiter_beside_two_running(model: ServiceModel, queued: bool) -> tuple[Admission, list[Ticket]]:
    """Two slots and an e2e target of 2.5 s, both slots taken by 8-token requests (0.96 s to go),
    and a request of 10 tokens arriving (beside another: 1.2 s, after 0.96 s of waiting), which
    must be `queued` (then withdrawn again), else refused at the door. The queue and those running."""
    queue = admission(FakeClock(), slo=SloConfig(e2e_s=2.5), model=model, max_in_flight=2)
    running = [await run(queue, max_tokens=8), await run(queue, max_tokens=8)]
    waiter = queue.ticket(1, 10, 10)
    if queued:
        assert not queue.admit_now(waiter)
        queue.withdraw(waiter)
    else:
        with pytest.raises(OverloadedError) as refused:
            queue.admit_now(waiter)
        assert refused.value.rejection == "overloaded"  # at the door, in milliseconds
    return queue, running


async def test_a_long_request_waits_if_its_own_spread_fits_where_the_spread_of_all_would_not() -> None:
    """Planned on the spread of all requests, long ones were refused at the door at 1x load while
    the engine served them in time."""
    # After 0.96 s of waiting 1.54 s are left, for 1.1x of its 1.2 s (1.32 s) but not 1.6x (1.92 s).
    for long_slow, queued in ((1.1, True), (1.6, False)):
        model = model_with_spreads(short_slow=1.6, long_slow=long_slow)
        await a_waiter_beside_two_running(model, queued)


async def test_a_request_that_would_wait_plans_on_a_slow_service_one_that_runs_now_on_the_median() -> None:
    """A tenth of the requests take 1.5x their prediction. Queued and then admitted with only the
    median's time left, a tenth of them came late (at 4x load on the CPU engine, most queued late
    answers); so a request that would wait needs time for a slow service, or it is refused at
    once. One that fits now plans on the median, so that a long request is not refused while the
    engine has room."""
    for slow, queued in ((1.0, True), (1.5, False)):
        # Its own 10 tokens beside another: 1.2 s, 1.8 s if slow; after 0.96 s of waiting 1.54 s left.
        queue, running = await a_waiter_beside_two_running(model_with_a_slow_tenth(slow), queued)
        queue.release(running[0], completed=True)
        # With room: 20 tokens beside the other, 2.4 s (3.6 s if slow) of a 2.5 s target: it runs.
        assert queue.admit_now(queue.ticket(1, 10, 20))


async def test_a_queued_request_is_admitted_only_with_time_left_for_a_slow_service() -> None:
    clock = FakeClock()
    queue = admission(clock, slo=SloConfig(e2e_s=2.5), model=model_with_a_slow_tenth(1.2), max_in_flight=2)
    await run(queue, max_tokens=30)  # alone, it runs whatever its target
    short = await run(queue, max_tokens=5)  # 0.6 s to go
    waiter = queue.ticket(1, 10, 10)  # 1.2 s, 1.44 s if slow: queued, 1.9 s left after its wait
    assert not queue.admit_now(waiter)
    clock.now += 1.2  # the short one took twice as long: 1.3 s left, enough for the median alone
    queue.release(short, completed=True)
    with pytest.raises(OverloadedError, match="latency target") as refused:
        await queue.wait_for_room(waiter)
    assert refused.value.rejection == "overloaded_after_waiting"
    assert queue.running == 1  # its place is left to a request with time to spare


async def test_the_correction_settles_on_the_engines_real_pace_instead_of_learning_its_own_error() -> None:
    clock = FakeClock()
    model = known_model(0.1, 0.01)
    queue = admission(clock, model=model, max_in_flight=1)
    corrections = []
    for _ in range(60):  # the engine is steadily 1.5x slower than the fit says
        ticket = await run(queue)
        clock.now += 1.5 * model.service_s(ticket.prompt_tokens, ticket.expected_tokens, 1, corrected=False)
        queue.release(ticket, completed=True)
        corrections.append(model.correction)
    assert corrections[-30:] == pytest.approx([1.5] * 30)


async def test_only_requests_that_ran_at_the_batch_admission_planned_on_teach_the_correction() -> None:
    clock = FakeClock()
    model = known_model(0.1, 0.01)
    queue = admission(clock, model=model, max_in_flight=64)
    # A fifth of the batch admission planned on, then the batch it planned on, 1.5x slow.
    for share_of_plan, pace in ((0.2, 0.5), (1.0, 1.5)):
        for _ in range(30):
            ticket = await run(queue)
            engine_batch = max(1, round(share_of_plan * ticket.planned_batch))
            for _ in range(ticket.expected_tokens):  # steps as the fit predicts them
                queue.observe_engine_step(model.step_s(engine_batch, corrected=False), engine_batch, 0)
            clock.now += pace * ticket.predicted_s
            queue.release(ticket, completed=True)
        if share_of_plan < 1:
            assert model.correction == 1.0, "at a lighter batch it ran faster, as it would"
    assert model.correction == pytest.approx(1.5)


async def test_a_request_that_ran_in_a_heavier_batch_than_planned_teaches_the_correction_nothing() -> None:
    """The first requests of a load are planned at the few arrivals so far; the rest then join
    them, and they take longer, as they would: the model is not wrong at the batch it planned."""
    clock = FakeClock()
    model = known_model(0.1, 0.01)
    queue = admission(clock, model=model, max_in_flight=64)
    for _ in range(30):
        clock.now += 60.0  # arrivals far apart: each plans to run nearly alone
        ticket = await run(queue)
        assert ticket.planned_batch < 8
        for _ in range(ticket.expected_tokens):  # but 64 sequences ran beside it
            queue.observe_engine_step(model.step_s(64, corrected=False), 64, 0)
        clock.now += 3 * ticket.predicted_s
        queue.release(ticket, completed=True)
    assert model.correction == 1.0


def engine_timed_model(
    base_s: float = 0.1, per_sequence_s: float = 0.01, per_prompt_token_s: float = 0.001
) -> ServiceModel:
    """A model that has seen the engine time steps of exactly base + per_sequence * batch +
    per_prompt_token * the prompt tokens the step took in."""
    model = ServiceModel()
    for batch, prompt_tokens in ((1, 0), (9, 0), (1, 100), (9, 100)) * 2:
        model.observe_engine_step(
            batch, base_s + per_sequence_s * batch + per_prompt_token_s * prompt_tokens, prompt_tokens
        )
    return model


async def test_a_request_whose_steps_took_in_more_prompts_than_planned_teaches_the_correction_nothing() -> (
    None
):
    """As a load fills the engine, its first requests' steps take in the fill's prompts, more than
    the turnover they were planned with: longer, as the model says they would be. Requests that
    ran as planned, 1.5x slow, still teach it."""
    clock = FakeClock()
    model = engine_timed_model(0.1, 0.01, 0.001)
    queue = admission(clock, model=model, max_in_flight=64)
    for extra_prompt_tokens, pace in ((300, 1.0), (0, 1.5)):
        for _ in range(30):
            ticket = await run(queue)
            batch, prompt_tokens = (
                ticket.planned_batch,
                round(ticket.planned_prompt_tokens) + extra_prompt_tokens,
            )
            took_s = model.prefill_s(ticket.prompt_tokens, corrected=False)
            for _ in range(ticket.expected_tokens):
                step_s = 0.1 + 0.01 * batch + 0.001 * prompt_tokens
                queue.observe_engine_step(step_s, batch, prompt_tokens)
                took_s += step_s
            clock.now += pace * took_s
            queue.release(ticket, completed=True)
        if extra_prompt_tokens:
            assert model.correction == 1.0, "its steps were longer by the prompts they took in"
    assert model.correction == pytest.approx(1.5, rel=0.05)


async def test_a_long_request_is_planned_at_the_batch_arrivals_keep_running_not_a_limit_never_reached() -> (
    None
):
    """Steps of 0.1 + 0.01 b s and an e2e target of 3 s: 10-token requests meet it up to 20
    running, so admission fills the engine to 20; a 14-token request would be late at 20."""
    for arrivals, admitted in ((0, True), (40, False)):
        clock = FakeClock()
        queue = admission(clock, slo=SloConfig(e2e_s=3.0), max_in_flight=100)
        running = await run(queue, max_tokens=10)
        for _ in range(arrivals):  # others admitted within the last second (and gone again)
            other = queue.ticket(1, 10, 10)
            assert queue.admit_now(other)
            queue.release(other, completed=False)
        assert queue.batch_limit() == 20
        long = queue.ticket(1, 10, 14)
        if admitted:  # two arrivals in 2 s keep ~3 running: it is served in 1.8 s
            assert queue.admit_now(long)
            queue.release(long, completed=True)
        else:  # 20 a second fill the 20 places: at 20 it would take 4.2 s
            with pytest.raises(OverloadedError):
                queue.admit_now(long)
        queue.release(running, completed=True)


async def test_the_door_plans_a_request_with_its_own_arrival_counted_as_the_queue_will() -> None:
    """Steps of 0.1 + 0.01 b s, an e2e target of 3 s: a 14-token request is late from a batch of
    12. Seven arrivals 0.16 s apart, too few to count from the first, read as 3.5 a second (7 in
    the last 2 s; the lower 10 % bound of the rate they came at is 3.3) and keep 6 running; the
    eighth counts the rate from the first (6.25 a second: 17 running). The long request is that
    eighth: the door refuses it as the queue would have, rather than the queue refusing it the
    same instant "after waiting", which the headroom would take for a queued request's miss."""
    clock = FakeClock()
    queue = admission(clock, slo=SloConfig(e2e_s=3.0), max_in_flight=100)
    running = await run(queue, max_tokens=10)
    for _ in range(6):
        clock.now += 0.16
        other = queue.ticket(1, 10, 10)
        assert queue.admit_now(other)
        queue.release(other, completed=False)
    assert queue.planned_batch() == 6
    clock.now += 0.16
    long = queue.ticket(1, 10, 14)
    with pytest.raises(OverloadedError) as refusal:
        queue.admit_now(long)
    assert refusal.value.rejection == "overloaded"  # at the door, not after waiting
    assert "would not finish within its latency target" in str(refusal.value)
    assert queue.headroom.missed == 0
    assert queue.headroom.share == pytest.approx(START_SHARE)
    assert queue.planned_batch() == 6  # the refused request is not counted as arriving
    queue.release(running, completed=True)


async def test_requests_refused_at_the_door_are_not_planned_on_as_part_of_the_batch() -> None:
    clock = FakeClock()
    queue = admission(clock, slo=SloConfig(e2e_s=3.0), max_in_flight=100)
    for _ in range(40):  # 20 a second arrive and are refused before they are admitted or queued
        queue.ticket(1, 10, 10)
    assert queue.planned_batch() == 1


async def test_the_batch_arrivals_keep_running_is_littles_law_at_that_batch_not_at_the_limit() -> None:
    """Steps of 0.1 + 0.01 b s, 10-token requests: a request takes 1 + 0.1 b s at a batch of b.
    5 a second keep N = 5 (1 + 0.1 N) = 10 running (11, rounded up as it settles), where the
    service at the limit of 64 (7.4 s) would say 37."""
    clock = FakeClock()
    queue = admission(clock, max_in_flight=64)
    start = clock.now
    for arrival in range(11):  # 5 a second for 2 s, each gone again
        clock.now = start + 0.2 * arrival
        other = queue.ticket(1, 10, 10)
        assert queue.admit_now(other)
        queue.release(other, completed=False)
    assert queue.planned_batch() == 11


async def test_at_the_start_of_a_load_the_arrival_rate_is_counted_from_its_first_request() -> None:
    """After an idle spell, 10 requests within half a second: 20 a second, not the 5 a second
    they would be over the last 2 s. At 20 a second no batch keeps up (each request adds 0.1 s
    to the others' 1 s): the engine will run at the limit."""
    clock = FakeClock()
    queue = admission(clock, max_in_flight=64)
    clock.now += 600
    for _ in range(10):
        other = queue.ticket(1, 10, 10)
        assert queue.admit_now(other)
        queue.release(other, completed=False)
        clock.now += 0.05
    assert queue.planned_batch() == 64


def turning_over_model() -> ServiceModel:
    """A model whose engine timed steps of 0.02 + 0.0015 b + 0.0002 q s (b running, q prompt
    tokens taken in), the last 200 after a load (no prompts), for requests of 160 prompt tokens
    and 32 tokens."""
    model = known_model(0.02, 0.0015)
    rng = random.Random(7)
    for _ in range(3000):
        batch, prompt_tokens = rng.randint(1, 64), rng.choice((0, 0, 0, 80, 160, 4000))
        model.observe_engine_step(batch, 0.02 + 0.0015 * batch + 0.0002 * prompt_tokens, prompt_tokens)
    for _ in range(200):  # a drain: the last steps took no prompts in
        model.observe_engine_step(64, 0.02 + 0.0015 * 64, 0)
    model.typical.observe(prompt_tokens=160, tokens=32)
    return model


def test_a_batch_turning_over_is_predicted_to_take_its_newcomers_prompts_in_from_the_start_of_a_load() -> (
    None
):
    model = turning_over_model()
    # 64 running for 32 steps each: every step 2 finish and 2 start, 320 prompt tokens a step.
    assert model.step_s(64) == pytest.approx(0.02 + 0.0015 * 64 + 0.0002 * 320, rel=0.02)
    assert model.step_s(16) == pytest.approx(0.02 + 0.0015 * 16 + 0.0002 * 80, rel=0.02)


def test_a_step_takes_in_no_more_prompt_tokens_than_the_queue_and_the_arrivals_bring() -> None:
    model = turning_over_model()
    assert model.step_s(64, inflow=0) == pytest.approx(0.02 + 0.0015 * 64, rel=0.02)
    assert model.step_s(64, inflow=100) == pytest.approx(0.02 + 0.0015 * 64 + 0.0002 * 100, rel=0.02)
    assert model.step_s(64, inflow=10_000) == pytest.approx(model.step_s(64))


async def test_as_a_burst_drains_a_request_is_planned_without_the_prompts_nobody_is_bringing() -> None:
    """Turning over at 40 running, each step takes 200 prompt tokens in (0.12 s a step), so a
    34-token request would take 4.1 s, past its 4 s target. Once nothing has arrived for 2 s and
    nothing waits, no prompt comes in: its steps take 0.08 s, 2.8 s in all."""
    for quiet_s, admitted in ((0.0, False), (3.0, True)):
        clock = FakeClock()
        slo = SloConfig(e2e_s=4.0)
        queue = admission(clock, slo=slo, model=turning_over_model(), max_in_flight=100, max_waiting=10)
        for _ in range(40):  # a burst, all admitted at once
            assert queue.admit_now(queue.ticket(1, 160, 32))
        clock.now += quiet_s
        long = queue.ticket(1, 160, 34)
        if admitted:
            assert queue.admit_now(long)
        else:
            with pytest.raises(OverloadedError, match="latency target"):
                queue.admit_now(long)


def test_where_the_engine_times_its_steps_a_prompt_costs_what_its_tokens_add_to_a_step() -> None:
    model = ServiceModel()
    for batch, prompt_tokens in [(1, 0), (8, 0), (4, 500), (16, 100), (32, 1000), (2, 0)] * 20:
        model.observe_engine_step(batch, 0.02 + 0.001 * batch + 0.0008 * prompt_tokens, prompt_tokens)
    # After an idle spell a first token also waits for the burst's other prompts in its step.
    model.observe_prefill(100, 1.0, batch=1)
    assert model.prefill_s(100) == pytest.approx(0.08, rel=0.05)


async def test_under_capacity_requests_are_admitted_at_once() -> None:
    queue = admission()
    await run(queue)
    await run(queue)
    assert queue.running == 2


async def test_waiters_are_admitted_first_come_first_served_as_slots_free() -> None:
    queue = admission(queue_timeout_s=5)
    big = await run(queue, sequences=2)
    order: list[str] = []

    async def wait(name: str) -> None:
        await run(queue)
        order.append(name)

    first, second = asyncio.create_task(wait("first")), asyncio.create_task(wait("second"))
    await asyncio.sleep(0)
    assert queue.waiting == 2
    queue.release(big, completed=True)
    await asyncio.gather(first, second)
    assert order == ["first", "second"]
    assert queue.running == 2


async def test_each_request_carries_the_e2e_admission_predicted_when_it_decided_and_what_it_took() -> None:
    clock = FakeClock()
    queue = admission(clock, queue_timeout_s=5)
    running = await run(queue, sequences=2)  # 10 steps at a batch of 2: 1.2 s
    assert running.predicted_e2e_s == pytest.approx(running.predicted_s * queue.model.correction)
    queued = queue.ticket(1, 10, 10)
    assert not queue.admit_now(queued)
    assert queued.forecast_wait_s == pytest.approx(1.2, rel=0.05)
    assert queued.predicted_e2e_s is not None
    assert queued.predicted_e2e_s > queued.forecast_wait_s, "its wait, then its own service"
    clock.now += 1.0
    queue.release(running, completed=True)
    await queue.wait_for_room(queued)
    clock.now += 1.5
    queue.release(queued, completed=True)
    assert queued.finished_at is not None
    assert queued.finished_at - queued.arrived_at == pytest.approx(2.5)


async def test_a_full_waiting_room_refuses_at_once_with_retry_after() -> None:
    queue = admission(max_waiting=1, queue_timeout_s=5)
    await run(queue, sequences=2)
    waiter = asyncio.create_task(run(queue))
    await asyncio.sleep(0)
    with pytest.raises(OverloadedError, match="waiting") as refused:
        await run(queue)
    assert int(refused.value.headers["Retry-After"]) >= 1
    waiter.cancel()


async def test_waiting_prompt_tokens_are_bounded() -> None:
    queue = admission(max_waiting_prompt_tokens=15, queue_timeout_s=5)
    await run(queue, sequences=2)
    waiter = asyncio.create_task(run(queue))
    await asyncio.sleep(0)
    with pytest.raises(OverloadedError, match="prompt tokens"):
        await run(queue)
    waiter.cancel()


async def test_a_waiting_request_with_several_choices_counts_its_prompt_once() -> None:
    """`n` choices share one prompt: the waiting room counts its tokens once, as usage does."""
    queue = admission(max_waiting_prompt_tokens=25, queue_timeout_s=5)
    await run(queue, sequences=2)
    waiter = asyncio.create_task(run(queue, sequences=2))  # 10 prompt tokens, 2 choices
    await asyncio.sleep(0)
    assert queue.waiting == 1
    queue.check(queue.ticket(1, 10, 10))  # 10 waiting + 10 <= 25
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)


async def test_without_an_e2e_target_a_request_waits_at_most_queue_timeout_s() -> None:
    queue = admission(queue_timeout_s=0.05, shed_by_estimate=False)
    await run(queue, sequences=2)
    with pytest.raises(OverloadedError, match="waited"):
        await run(queue)
    assert queue.waiting == 0


async def test_a_queued_request_whose_wait_runs_out_waits_on_while_it_still_has_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its time left is looked at again when its wait runs out: the queue ahead of it may have
    drained meanwhile, so that it needs less time in the engine than when it began to wait."""
    queue = admission(queue_timeout_s=5, shed_by_estimate=False)
    running = await run(queue, sequences=2)
    time_left_s = 0.05
    monkeypatch.setattr(queue, "_wait_budget_s", lambda ticket, slow=True: time_left_s)
    waiter = asyncio.create_task(run(queue))
    await asyncio.sleep(0.01)
    time_left_s = 0.5  # the queue ahead drained: the engine will serve it faster
    await asyncio.sleep(0.1)  # past the 0.05 s it had when it began to wait
    assert not waiter.done()
    assert queue.waiting == 1
    queue.release(running, completed=False)
    await waiter
    assert queue.running == 1


async def test_a_cancelled_waiter_leaves_the_queue_and_takes_no_slot() -> None:
    queue = admission(queue_timeout_s=5)
    big = await run(queue, sequences=2)
    waiter = asyncio.create_task(run(queue))
    await asyncio.sleep(0)
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert queue.waiting == 0
    queue.release(big, completed=False)
    assert queue.running == 0


async def test_a_request_that_would_wait_past_its_budget_is_refused_at_once_with_an_honest_retry_after() -> (
    None
):
    clock = FakeClock()
    queue = admission(clock, max_in_flight=1, max_waiting=10, queue_timeout_s=2.0)
    running = await run(queue, max_tokens=30)  # 30 tokens at 0.11 s: done in 3.3 s
    ticket = queue.ticket(1, 10, 10)
    with pytest.raises(OverloadedError, match=r"wait about 3\.3 s") as shed:
        queue.check(ticket)
    assert shed.value.headers["Retry-After"] == "2"  # 3.3 s of wait, 2 s allowed: ~1.3 s too early
    # A client that comes back after Retry-After finds the running request nearly done: it waits.
    clock.now += 2
    running.generated = 20
    queue.check(queue.ticket(1, 10, 10))


async def test_right_after_an_idle_period_a_burst_is_admitted_up_to_what_fits() -> None:
    """No decaying completion rate: the model predicts the same after an hour of idleness."""
    clock = FakeClock()
    queue = admission(clock, max_in_flight=4, max_waiting=100, queue_timeout_s=1.0)
    clock.now += 3600
    burst = [asyncio.create_task(run(queue, max_tokens=4)) for _ in range(40)]
    await asyncio.sleep(0)  # each has been admitted, queued or refused
    refused = [task for task in burst if task.done() and isinstance(task.exception(), OverloadedError)]
    # 4 run (4 tokens at 0.14 s: 0.56 s); the next 4 get their slots then, within their 1 s; the
    # 32 others would wait 1.12 s or more, so they are refused at once.
    assert (queue.running, queue.waiting, len(refused)) == (4, 4, 32)
    for task in burst:
        task.cancel()
    await asyncio.gather(*burst, return_exceptions=True)


async def test_with_an_e2e_target_admission_keeps_running_requests_within_their_deadlines() -> None:
    clock = FakeClock()
    slo = SloConfig(e2e_s=2.0)
    queue = admission(clock, slo=slo, max_in_flight=64, max_waiting=10)
    first = await run(queue, max_tokens=14)  # alone: 14 x 0.11 = 1.54 s of its 2 s
    assert first.deadline_at == pytest.approx(clock.now + 2.0)
    # A second one would make every step 0.12 s: the first then needs 1.68 s: still in time.
    second = await run(queue, max_tokens=14)
    assert queue.running == 2
    # A third: steps of 0.13 s, 14 x 0.13 = 1.82 s: still fits. A fourth (0.14 s, 1.96 s) too; a
    # fifth (0.15 s: 2.1 s) would miss: it waits for room instead of making everyone late.
    await run(queue, max_tokens=14)
    await run(queue, max_tokens=14)
    # Waiting for one of them to finish (~2 s) would make it miss its own target: refused now.
    with pytest.raises(OverloadedError, match="latency target") as refused:
        await run(queue, max_tokens=14)
    assert queue.running == 4
    assert int(refused.value.headers["Retry-After"]) >= 1
    queue.release(second, completed=True)
    await run(queue, max_tokens=14)
    assert queue.running == 4


async def test_a_requests_targets_count_the_time_it_waited_before_the_server_read_it() -> None:
    clock = FakeClock()
    queue = admission(clock, slo=SloConfig(e2e_s=2.0), max_in_flight=64, max_waiting=10)
    await run(queue, max_tokens=14)  # keeps the engine busy: 1.54 s alone, 1.68 s beside another
    # 0.2 s in the accept queue leaves 1.8 s: still time for its 1.68 s.
    patient = await run(queue, max_tokens=14, read_delay_s=0.2)
    assert patient.deadline_at == pytest.approx(clock.now - 0.2 + 2.0)
    # 0.5 s there leaves 1.5 s, less than its 1.82 s beside the two: refused at once, and told why.
    with pytest.raises(OverloadedError, match=r"waited 0\.50 s before the server could read it"):
        await run(queue, max_tokens=14, read_delay_s=0.5)
    # Without that wait it would have fitted.
    await run(queue, max_tokens=14)
    assert queue.running == 3


async def test_a_request_that_waited_past_its_target_before_it_was_read_is_served_by_an_idle_engine() -> None:
    queue = admission(slo=SloConfig(e2e_s=2.0), max_in_flight=64)
    late = await run(queue, max_tokens=14, read_delay_s=3.0)
    assert queue.running == 1
    assert late.admitted_at is not None


async def test_queued_requests_that_meet_their_deadline_widen_the_queue_and_late_ones_narrow_it() -> None:
    clock = FakeClock()
    queue = admission(clock, slo=SloConfig(e2e_s=2.0), max_in_flight=2, max_waiting=10)
    first = await run(queue, sequences=2, max_tokens=10)  # 1.2 s to go; a waiter has 2 s - 0.12 s
    waiter = asyncio.create_task(run(queue, max_tokens=1))
    await asyncio.sleep(0)
    assert queue.waiting == 1
    clock.now += 1.2
    queue.release(first, completed=True)
    served = await waiter
    clock.now += 0.2
    queue.release(served, completed=True)  # 1.3 s after it arrived: met
    assert (queue.headroom.met, queue.headroom.missed) == (1, 0)
    widened = queue.headroom.share

    blockers = [await run(queue, max_tokens=10), await run(queue, max_tokens=10)]
    late = asyncio.create_task(run(queue, max_tokens=1))
    await asyncio.sleep(0)
    assert queue.waiting == 1
    clock.now += 1.95  # the engine was slower than predicted: the waiter can no longer make it
    queue.release(blockers[0], completed=True)
    with pytest.raises(OverloadedError, match="latency target") as refused:
        await late
    assert refused.value.rejection == "overloaded_after_waiting"  # a slow refusal, counted apart
    assert queue.headroom.missed == 1
    assert queue.headroom.share < widened


async def test_the_headroom_decides_how_long_a_wait_the_queue_takes_on() -> None:
    clock = FakeClock()
    queue = admission(clock, max_in_flight=1, max_waiting=10, queue_timeout_s=4.0)
    await run(queue, max_tokens=30)  # 3.3 s to go
    queue.check(queue.ticket(1, 10, 10))  # 3.3 s <= 4 s: until a miss it may wait its whole budget
    queue.headroom.share = 0.8  # after queued requests missed their targets
    with pytest.raises(OverloadedError, match=r"wait about 3\.3 s") as refused:
        queue.check(queue.ticket(1, 10, 10))  # 3.3 s > 0.8 x 4 s
    assert refused.value.rejection == "overloaded"


async def test_with_max_queue_wait_s_the_door_queues_no_request_for_a_longer_wait() -> None:
    """Whatever its target allows: refused at once, told to come back when its wait would fit."""
    clock = FakeClock()
    queue = admission(clock, max_in_flight=1, max_waiting=10, queue_timeout_s=4.0, max_queue_wait_s=2.0)
    blocker = await run(queue, max_tokens=15)  # 1.65 s to go
    queue.check(queue.ticket(1, 10, 10))  # 1.65 s: within the cap and the 4 s the queue deadline leaves
    queue.release(blocker, completed=False)
    await run(queue, max_tokens=30)  # 3.3 s to go
    with pytest.raises(
        OverloadedError, match=r"wait about 3\.3 s, longer than the queue takes on \(2 s\)"
    ) as refused:
        queue.check(queue.ticket(1, 10, 10))
    assert refused.value.rejection == "overloaded"  # at the door, in milliseconds
    assert refused.value.retry_after_s == 2  # then 2 s or less to wait: 3.3 s - 2 s, rounded up


@settings(max_examples=200, deadline=None)
@given(
    base_ms=st.floats(1, 200),
    per_sequence_ms=st.floats(0, 20),
    e2e_s=st.none() | st.floats(0.1, 30),
    tpot_ms=st.none() | st.floats(1, 300),
    ttft_s=st.none() | st.floats(0.05, 5),
    max_in_flight=st.integers(1, 600),
    prompt_tokens=st.integers(1, 4000),
)
def test_the_batch_limit_is_the_largest_batch_at_which_a_typical_request_meets_every_target(
    base_ms: float,
    per_sequence_ms: float,
    e2e_s: float | None,
    tpot_ms: float | None,
    ttft_s: float | None,
    max_in_flight: int,
    prompt_tokens: int,
) -> None:
    slo = SloConfig(e2e_s=e2e_s, tpot_s=tpot_ms and tpot_ms / 1000, ttft_s=ttft_s)
    model = known_model(base_ms / 1000, per_sequence_ms / 1000)
    queue = Admission(AdmissionConfig(max_in_flight=max_in_flight), slo, model, FakeClock())
    queue.model.typical.observe(prompt_tokens, 64)

    def late(batch: int) -> bool:  # the definition, batch by batch
        step = model.step_s(batch)
        return (
            (slo.tpot_s is not None and step > slo.tpot_s)
            or (slo.ttft_s is not None and model.prefill_s(prompt_tokens) + step > slo.ttft_s)
            or (slo.e2e_s is not None and model.service_s(prompt_tokens, 64, batch) > slo.e2e_s)
        )

    first_late = next((b for b in range(1, max_in_flight + 1) if late(b)), None)
    assert queue.batch_limit() == (max_in_flight if first_late is None else max(1, first_late - 1))


@settings(max_examples=60, deadline=None)
@given(
    lessons=st.lists(
        st.tuples(
            st.sampled_from(["step", "engine_step", "prefill", "service", "arrival", "finish"]),
            st.integers(1, 64),
            st.floats(0.001, 0.5),
        ),
        max_size=30,
    )
)
def test_the_batch_limit_and_typical_service_kept_between_requests_follow_everything_the_model_learns(
    lessons: list[tuple[str, int, float]],
) -> None:
    """Admission keeps both until the model changes (they are asked for several times per request);
    after any lesson they are what the model predicts afresh."""
    model = known_model(0.005, 0.002)
    slo = SloConfig(e2e_s=0.3, ttft_s=0.1)
    queue = Admission(AdmissionConfig(max_in_flight=256), slo, model, FakeClock())
    for kind, count, seconds in lessons:
        if kind == "step":
            model.observe_step(count, seconds / 10)
        elif kind == "engine_step":
            model.observe_engine_step(count, seconds / 10, count * 10)
        elif kind == "prefill":
            model.observe_prefill(count * 10, seconds, 1)
        elif kind == "service":  # the correction moves from the tenth on
            for _ in range(10):
                model.observe_service(predicted_s=seconds, actual_s=seconds * count / 16, tokens=count)
        elif kind == "arrival":
            model.typical.observe(count * 10, count)
        else:
            model.observe_finish(count, 64)
        tokens, prompt_tokens = model.typical.tokens, model.typical.prompt_tokens
        # The definition, from the model's predictions afresh:
        first_late = next(
            (
                batch
                for batch in range(1, 257)
                if model.prefill_s(prompt_tokens) + model.step_s(batch) > 0.1
                or model.service_s(prompt_tokens, tokens, batch) > 0.3
            ),
            None,
        )
        assert queue.batch_limit() == (256 if first_late is None else max(1, first_late - 1))
        for batch in (1, count, 256):
            assert model.typical_service_s(batch) == model.service_s(prompt_tokens, tokens, batch)


def test_the_model_taken_at_one_batch_predicts_a_service_as_its_steps_and_prefill_do() -> None:
    """What a queue's forecast reads for every queued request, taken once: the same prefill and
    steps the model predicts one by one (with and without the correction, whatever the inflow)."""
    model = model_with_a_slow_tenth(1.2)
    for batch, prompt_tokens in ((1, 0), (8, 120), (40, 30)):
        model.observe_engine_step(batch, 0.1 + 0.01 * batch + 0.0004 * prompt_tokens, prompt_tokens)
    for _ in range(30):
        model.observe_service(1.0, 1.3, tokens=20)
    assert model.correction == pytest.approx(1.3)
    for batch in (1, 16, 64):
        for corrected in (True, False):
            line = model.at(batch, corrected)
            for inflow in (None, 0.0, 5.0, 1e6):
                by_steps = model.prefill_s(50, corrected) + 20 * model.step_s(batch, corrected, inflow)
                assert line.service_s(50, 20, inflow) == pytest.approx(by_steps, rel=1e-12)


async def test_a_request_that_cannot_meet_the_target_even_alone_is_served_best_effort() -> None:
    queue = admission(slo=SloConfig(e2e_s=1.0), max_in_flight=64)
    long = await run(queue, max_tokens=1000)
    assert long.deadline_at is None
    assert queue.running == 1


async def test_a_request_whose_tokens_do_not_fit_the_kv_cache_beside_the_running_ones_waits() -> None:
    queue = admission(max_in_flight=64, queue_timeout_s=100)
    queue.kv_capacity_tokens = 1000
    first = await run(queue, max_tokens=500)  # 10 + 500 tokens
    waiter = asyncio.create_task(run(queue, max_tokens=600))  # 610 more would not fit
    await asyncio.sleep(0)
    assert (queue.running, queue.waiting) == (1, 1)
    queue.release(first, completed=True)
    await waiter
    assert queue.running == 1


def engine_capped(max_in_flight: int, engine_sequences: int, slo: SloConfig | None = None) -> Admission:
    config = AdmissionConfig(max_in_flight=max_in_flight, max_waiting=100, queue_timeout_s=30)
    model, clock = known_model(), FakeClock()
    return Admission(config, slo or SloConfig(), model, clock, engine_sequences=engine_sequences)


async def test_where_the_batch_limit_is_the_engines_own_a_few_are_kept_ready_in_its_queue() -> None:
    """vLLM runs 64 and queues the rest itself: two steps' turnover of 32-token requests (4)
    wait there, so that a slot a finished request frees is filled at the next step, not after
    the API process has taken the output and sent the next request."""
    queue = engine_capped(max_in_flight=64, engine_sequences=64)
    tickets = [queue.ticket(1, 10, 32) for _ in range(80)]
    admitted = [queue.admit_now(ticket) for ticket in tickets]
    reserve = queue.ready_reserve(64)
    assert reserve == math.ceil(2 * 64 / queue.model.typical.tokens)
    assert reserve >= 2
    assert admitted.count(True) == 64 + reserve
    assert queue.waiting == 80 - 64 - reserve
    # Planned at the batch the engine runs, not at the 64 + reserve admitted.
    assert queue.planned_batch() == 64
    assert tickets[64 + reserve - 1].planned_batch == 64


async def test_below_the_engines_own_limit_nothing_is_kept_ready_beyond_the_batch_limit() -> None:
    """vLLM would run them at once: max_in_flight or the SLO's batch limit would not hold."""
    queue = engine_capped(max_in_flight=8, engine_sequences=64)
    assert [queue.admit_now(queue.ticket(1, 10, 32)) for _ in range(10)].count(True) == 8
    slow = engine_capped(max_in_flight=64, engine_sequences=64, slo=SloConfig(e2e_s=5.0))
    slow.ticket(1, 10, 32)  # the traffic: 32-token requests, which take 5 s at a batch of 5
    assert slow.batch_limit() < 64
    assert slow.ready_reserve(slow.batch_limit()) == 0


async def test_a_prompt_list_holds_each_prompt_once_in_the_kv_cache_not_once_per_prompt() -> None:
    queue = admission(max_in_flight=64, queue_timeout_s=100)
    queue.kv_capacity_tokens = 1000
    await run(queue, max_tokens=500)  # 10 + 500 tokens
    # Four prompts of 100 tokens, n=1: 400 prompt tokens and 4 x 10 generated (not 4 x 410).
    listed = queue.ticket(4, 400, 10, kv_prompt_tokens=400)
    assert listed.kv_tokens == 440
    assert queue.admit_now(listed)
    # One prompt of 100 tokens, n=4: each sequence holds it.
    assert queue.ticket(4, 100, 10).kv_tokens == 440


def test_a_requests_cost_counts_prompts_once_for_usage_and_once_per_sequence_for_the_kv_cache() -> None:
    planned = [
        PlannedPrompt(TokenizedPrompt(tuple(range(100))), SamplingSpec(max_tokens=10, n=2)),
        PlannedPrompt(TokenizedPrompt(tuple(range(50))), SamplingSpec(max_tokens=10, n=1)),
    ]
    assert cost_of(planned) == Cost(sequences=3, prompt_tokens=150, max_new_tokens=30, kv_prompt_tokens=250)


async def test_one_keys_burst_does_not_starve_another_key() -> None:
    queue = admission(max_in_flight=1, max_waiting=100, queue_timeout_s=30)
    blocker = await run(queue, key="a")
    order: list[str] = []

    async def request(key: str, name: str) -> Ticket:
        ticket = await run(queue, key=key)
        order.append(name)
        return ticket

    burst = [asyncio.create_task(request("a", f"a{i}")) for i in range(5)]
    await asyncio.sleep(0)
    other = asyncio.create_task(request("b", "b0"))
    await asyncio.sleep(0)
    current = blocker
    for _ in range(6):
        queue.release(current, completed=True)
        await asyncio.sleep(0)
        current = next(iter(queue._running))
    await asyncio.gather(*burst, other)
    assert order.index("b0") <= 1, (
        f"b's request is served right after a's first, not after its burst: {order}"
    )


async def test_a_lower_priority_number_is_served_first() -> None:
    queue = admission(max_in_flight=1, max_waiting=10, queue_timeout_s=30)
    blocker = await run(queue)
    order: list[str] = []

    async def request(name: str, priority: int) -> None:
        ticket = await run(queue, priority=priority)
        order.append(name)
        queue.release(ticket, completed=True)

    tasks = [asyncio.create_task(request("later", 5)), asyncio.create_task(request("sooner", -1))]
    await asyncio.sleep(0)
    queue.release(blocker, completed=True)
    await asyncio.gather(*tasks)
    assert order == ["sooner", "later"]


@asynccontextmanager
async def ready_client(
    token_delay_s: float, *settings: str
) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    """The app over FakeEngine with these settings, started and ready, and a client of it."""
    engine = FakeEngine()
    engine.token_delay_s = token_delay_s
    overrides = parse_overrides(list(settings))
    app = create_app(load_config(None, overrides), engine_starter=fake_starter(engine), on_fatal=lambda: None)
    async with app.router.lifespan_context(app):
        while not app.state.runtime.is_ready:  # noqa: ASYNC110 - the runtime owns this flag
            await asyncio.sleep(0.01)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=30) as client:
            yield app, client


async def test_overload_over_http_is_a_fast_429_with_retry_after() -> None:
    settings = ("admission.max_in_flight=1", "admission.max_waiting=1", "admission.queue_timeout_s=30")
    async with ready_client(0.05, *settings) as (app, client):
        body = {"model": MODEL, "prompt": "a", "max_tokens": 10}
        responses = await asyncio.gather(*(client.post("/v1/completions", json=body) for _ in range(4)))
        statuses = sorted(r.status_code for r in responses)
        assert statuses == [200, 200, 429, 429]
        refused = next(r for r in responses if r.status_code == 429)
        assert refused.json()["error"]["code"] == "overloaded"
        assert int(refused.headers["retry-after"]) >= 1
        metrics = Scrape.parse((await client.get("/metrics")).text)
    assert metrics.value("llmserve_rejections_total", reason="overloaded") == 2
    assert metrics.value("llmserve_queue_wait_seconds_count") == 2
    assert metrics.value("llmserve_rejection_latency_seconds_count") == 2
    assert app.state.permits.admission.running == 0


async def test_metrics_compare_what_each_request_took_with_what_admission_predicted() -> None:
    settings = ("admission.max_in_flight=1", "admission.max_waiting=1", "admission.queue_timeout_s=30")
    async with ready_client(0.02, *settings) as (_, client):
        body = {"model": MODEL, "prompt": "a", "max_tokens": 10}
        responses = await asyncio.gather(*(client.post("/v1/completions", json=body) for _ in range(2)))
        assert [r.status_code for r in responses] == [200, 200]
        refused = await asyncio.gather(*(client.post("/v1/completions", json=body) for _ in range(3)))
        assert sorted(r.status_code for r in refused) == [200, 200, 429]
        metrics = Scrape.parse((await client.get("/metrics")).text)
    ratio = "llmserve_admission_e2e_prediction_ratio"
    assert metrics.value(f"{ratio}_count", decision="run_at_once") == 2
    assert metrics.value(f"{ratio}_count", decision="queued") == 2, "one a round, not the refused"
    assert metrics.value(f"{ratio}_sum", decision="queued") > 0
    waits = "llmserve_admission_queue_wait_prediction_ratio"
    assert metrics.value(f"{waits}_count") == 2, "the queue's own forecast, apart from the service"


async def test_metrics_count_which_admitted_requests_missed_their_e2e_deadline() -> None:
    async with ready_client(0.02, "slo.e2e_s=1.0") as (app, client):
        body = {"model": MODEL, "prompt": "a", "max_tokens": 10}  # 0.2 s of generation
        assert (await client.post("/v1/completions", json=body)).status_code == 200
        engine = app.state.runtime.engine()
        assert isinstance(engine, FakeEngine)
        engine.token_delay_s = 0.15  # the engine slows down: 1.5 s, past the 1 s target
        assert (await client.post("/v1/completions", json=body)).status_code == 200
        metrics = Scrape.parse((await client.get("/metrics")).text)
    outcomes = "llmserve_admission_deadline_outcomes_total"
    assert metrics.value(outcomes, decision="run_at_once", outcome="met") == 1
    assert metrics.value(outcomes, decision="run_at_once", outcome="missed") == 1
    assert metrics.value(outcomes, decision="queued", outcome="missed") == 0
    assert metrics.value(outcomes, outcome="best_effort") == 0


async def test_metrics_count_requests_admitted_without_a_deadline_as_best_effort() -> None:
    async with ready_client(0.02, "slo.e2e_s=0.1") as (_, client):
        body = {"model": MODEL, "prompt": "a", "max_tokens": 10}  # 0.2 s even alone: no deadline
        assert (await client.post("/v1/completions", json=body)).status_code == 200
        metrics = Scrape.parse((await client.get("/metrics")).text)
    outcomes = "llmserve_admission_deadline_outcomes_total"
    assert metrics.value(outcomes, decision="run_at_once", outcome="best_effort") == 1
    assert metrics.value(outcomes, outcome="missed") == 0


async def test_metrics_time_refusals_at_arrival_apart_from_refusals_after_waiting() -> None:
    settings = (
        "admission.max_in_flight=1",
        "admission.max_waiting=1",
        "admission.queue_timeout_s=0.3",
        "admission.shed_by_estimate=false",
    )
    async with ready_client(0.05, *settings) as (_, client):
        body = {"model": MODEL, "prompt": "a", "max_tokens": 20}  # 1 s of generation
        running = asyncio.create_task(client.post("/v1/completions", json=body))
        await asyncio.sleep(0.1)
        queued = asyncio.create_task(client.post("/v1/completions", json=body))
        await asyncio.sleep(0.1)
        at_once = await client.post("/v1/completions", json=body)  # the waiting room is full
        assert at_once.status_code == 429
        assert (await queued).status_code == 429  # its queue_timeout_s ran out
        assert (await running).status_code == 200
        metrics = Scrape.parse((await client.get("/metrics")).text)
    at_arrival = metrics.value("llmserve_rejection_latency_seconds_sum", when="at_arrival")
    after_waiting = metrics.value("llmserve_rejection_latency_seconds_sum", when="after_waiting")
    assert metrics.value("llmserve_rejection_latency_seconds_count", when="at_arrival") == 1
    assert metrics.value("llmserve_rejection_latency_seconds_count", when="after_waiting") == 1
    assert after_waiting >= 0.3
    assert at_arrival < after_waiting


async def test_metrics_show_the_batch_admission_fills_the_engine_to() -> None:
    async with ready_client(0.0, "admission.max_in_flight=7") as (app, client):
        metrics = Scrape.parse((await client.get("/metrics")).text)
    assert metrics.value("llmserve_admission_batch_limit") == 7, "without an SLO: max_in_flight"
    assert app.state.permits.admission.batch_limit() == 7


async def test_a_client_that_waits_its_retry_after_is_then_served() -> None:
    settings = ("admission.max_in_flight=2", "admission.max_waiting=2", "admission.queue_timeout_s=1")
    async with ready_client(0.02, *settings) as (_, client):
        body = {"model": MODEL, "prompt": "a", "max_tokens": 20}

        async def until_served() -> tuple[int, int]:
            """(attempts, final status), each retry after the Retry-After it was given."""
            for attempt in range(1, 4):
                response = await client.post("/v1/completions", json=body)
                if response.status_code != 429:
                    return attempt, response.status_code
                await asyncio.sleep(int(response.headers["retry-after"]))
            return attempt, response.status_code

        results = await asyncio.gather(*(until_served() for _ in range(10)))
    assert all(status == 200 for _, status in results), results
    retried = [attempts for attempts, _ in results if attempts > 1]
    assert retried, "the burst of 10 at 2 running + 2 waiting places was partly refused"
    assert sum(1 for attempts in retried if attempts == 2) >= 0.9 * len(retried), (
        "waiting Retry-After once is enough for nearly every refused client"
    )


async def test_refusals_of_a_long_burst_are_told_to_come_back_spread_out_and_at_most_a_minute_later() -> None:
    queue = admission(max_in_flight=2, max_waiting=0, queue_timeout_s=0.1)
    await run(queue, sequences=2, max_tokens=10)  # busy for 1.2 s
    retry_afters = []
    for _ in range(1000):
        with pytest.raises(OverloadedError) as refused:
            queue.check(queue.ticket(1, 10, 10))
        retry_afters.append(int(refused.value.headers["Retry-After"]))
    assert retry_afters == sorted(retry_afters), "later refusals are told to come back later"
    assert retry_afters[0] <= 2
    assert retry_afters[-1] == 60, "never more than a minute"
    assert len(set(retry_afters)) > 30, "spread over the coming minute, two or so per second"


async def test_once_the_engine_times_its_steps_admission_learns_from_those() -> None:
    queue = admission(max_in_flight=64)
    running = [await run(queue) for _ in range(4)]
    assert not queue.model.engine_times_steps
    before = queue.model.step_s(30)
    for _ in range(200):  # the engine ran 30 sequences (some admitted by other API processes)
        queue.observe_engine_step(1.0, engine_running=30, prompt_tokens=0)
    assert queue.model.engine_times_steps
    assert before < 0.5
    assert queue.model.step_s(30) == pytest.approx(1.0, rel=0.05)
    for ticket in running:
        queue.release(ticket, completed=False)


def test_the_engine_steps_teach_a_cost_per_sequence_and_per_prompt_token_taken_in() -> None:
    model = known_model(0.02, 0.0015)
    rng = random.Random(7)
    for _ in range(3000):
        batch, prompt_tokens = rng.randint(1, 64), rng.choice((0, 0, 0, 80, 160, 4000))
        model.observe_engine_step(batch, 0.02 + 0.0015 * batch + 0.0002 * prompt_tokens, prompt_tokens)
    # Predictions are for steps as they usually come: the prompts arriving now are spread over them.
    for _ in range(200):
        model.observe_engine_step(64, 0.02 + 0.0015 * 64, 0)
    assert model.step_s(64) == pytest.approx(0.02 + 0.0015 * 64, rel=0.02)
    model.observe_engine_step(64, 0.02 + 0.0015 * 64 + 0.0002 * 4000, 4000)  # a burst's prompts
    assert model.step_s(64) == pytest.approx(0.02 + 0.0015 * 64 + 0.0002 * 4000 * 0.05, rel=0.02)


async def test_a_refusal_over_http_is_answered_without_a_turn_of_the_event_loop() -> None:
    """Every turn of the loop waits behind the other requests' work: under load a refusal that
    took turns (a task to wait in, a body read under wait_for) took 6 ms at the median for its own
    0.4 ms. With the body in hand, the whole app answers the refusal in one step."""
    settings = ("admission.max_in_flight=1", "admission.max_waiting=0")
    async with ready_client(0.05, *settings) as (app, client):
        running = asyncio.create_task(
            client.post("/v1/completions", json={"model": MODEL, "prompt": "a", "max_tokens": 20})
        )
        while app.state.permits.admission.running == 0:  # noqa: ASYNC110 - polling the fake's state
            await asyncio.sleep(0.005)
        body = f'{{"model": "{MODEL}", "prompt": "a b c", "max_tokens": 4}}'.encode()
        sent: list[dict[str, object]] = []

        async def receive() -> dict[str, object]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, object]) -> None:
            sent.append(message)

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/v1/completions",
            "raw_path": b"/v1/completions",
            "query_string": b"",
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            "client": ("127.0.0.1", 1),
            "server": ("127.0.0.1", 80),
            "root_path": "",
        }
        with pytest.raises(StopIteration):
            app(scope, receive, send).send(None)  # type: ignore[arg-type]
        assert sent[0]["status"] == 429
        await running


async def test_while_few_answers_came_late_a_queued_request_short_of_a_slow_service_runs_at_risk() -> None:
    """The e2e target is a 99th percentile: while fewer than 1 in 100 of the recent admitted
    requests came late, a queued request with time left for its median service (not a slow one)
    is admitted at risk rather than refused seconds after it arrived, as many as the late answers
    they are expected to make fit the budget."""
    clock = FakeClock()
    queue = admission(clock, slo=SloConfig(e2e_s=2.5), model=model_with_a_slow_tenth(1.2), max_in_flight=2)
    for _ in range(100):  # admitted requests answered in time: a budget of one late answer
        queue.late_budget.finished(late=False, at_risk=False)
    await run(queue, max_tokens=30)
    short = await run(queue, max_tokens=5)  # 0.6 s to go
    waiter = queue.ticket(1, 10, 10)  # 1.2 s, 1.44 s if slow: queued, 1.9 s left after its wait
    assert not queue.admit_now(waiter)
    clock.now += 1.2  # the short one took twice as long: 1.3 s left, enough for the median alone
    queue.release(short, completed=True)
    await queue.wait_for_room(waiter)  # refused after waiting without the budget (test above)
    assert waiter.at_risk
    assert queue.late_budget.at_risk == 1, "it counts against the budget until it finishes"
    assert queue.headroom.missed == 1, "the queue's promise is broken, as by a refusal: learned at once"
    clock.now += 1.2
    queue.release(waiter, completed=True)  # in time after all
    assert queue.late_budget.at_risk == 0
    assert queue.late_budget.late_chance() == pytest.approx(1 / 3), "1 of 1 in time, with Laplace's prior"
    assert (queue.headroom.met, queue.headroom.missed) == (0, 1), "its outcome is not learned twice"


def test_the_late_answer_budget_is_a_hundredth_of_the_latest_admitted_less_the_late_and_those_expected() -> (
    None
):
    budget = LateBudget()
    for _ in range(99):
        budget.finished(late=False, at_risk=False)
    assert not budget.has_room(), "too few seen to count on"
    budget.finished(late=False, at_risk=False)
    assert budget.has_room()
    budget.take()
    assert budget.has_room(), "before any at risk came out, each counts as half a late answer"
    budget.take()
    assert not budget.has_room(), "the one late answer in 100 is taken by the two at risk"
    budget.finished(late=True, at_risk=True)
    budget.finished(late=False, at_risk=True)
    assert not budget.has_room(), "one came late: 1 in 102, and the next at risk as likely late as not"
    for _ in range(98):
        budget.finished(late=False, at_risk=False)
    assert budget.has_room(), "1 late in 200: room for one more"
    for _ in range(500):
        budget.finished(late=False, at_risk=False)
    assert budget.has_room()
    for _ in range(5):
        budget.finished(late=True, at_risk=False)
    assert not budget.has_room(), "5 late in the latest 500"
    budget.finished(late=None, at_risk=False)  # cancelled, or without a deadline: not counted
    assert not budget.has_room()


def test_requests_at_risk_count_by_the_chance_that_the_latest_of_them_came_late() -> None:
    """Counted as late outright, four at a time filled the budget while most of them came in time."""

    def budget_after(at_risk_outcomes: list[bool]) -> LateBudget:
        budget = LateBudget()
        for late in at_risk_outcomes:
            budget.take()
            budget.finished(late=late, at_risk=True)
        for _ in range(500 - len(at_risk_outcomes)):
            budget.finished(late=False, at_risk=False)
        return budget

    in_time = budget_after([False] * 8)
    assert in_time.late_chance() == pytest.approx(0.1)
    for _ in range(20):
        in_time.take()
    assert in_time.has_room(), "20 at risk are expected to make 2.1 late answers of the 5 allowed"
    half_late = budget_after([True, False] * 2)
    for _ in range(5):
        half_late.take()
    assert half_late.has_room(), "2 late in 500, and 5 at risk expected to make 2.5 more"
    half_late.take()
    assert not half_late.has_room()
