"""Admission control: bounded FIFO queue, queue deadline, shedding from the observed drain rate."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from loadtest.prom import Scrape

from llmserve.app import create_app
from llmserve.config import AdmissionConfig, load_config, parse_overrides
from llmserve.errors import OverloadedError
from llmserve.policy.admission import AdmissionQueue
from tests.fake_engine import FakeEngine, fake_starter
from tests.unit.conftest import MODEL


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def controller(clock: FakeClock | None = None, **limits: object) -> AdmissionQueue:
    settings = {"max_in_flight": 2, "max_waiting": 2, "queue_timeout_s": 0.5, **limits}
    return AdmissionQueue(AdmissionConfig.model_validate(settings), clock or FakeClock())


async def test_under_capacity_requests_are_admitted_at_once() -> None:
    admission = controller()
    await admission.admit(1, 10)
    await admission.admit(1, 10)
    assert admission.running == 2


async def test_waiters_are_admitted_first_come_first_served_as_slots_free() -> None:
    admission = controller()
    await admission.admit(2, 10)
    order: list[str] = []

    async def wait(name: str) -> None:
        await admission.admit(1, 10)
        order.append(name)

    first, second = asyncio.create_task(wait("first")), asyncio.create_task(wait("second"))
    await asyncio.sleep(0)
    assert admission.waiting == 2
    admission.release(2)
    await asyncio.gather(first, second)
    assert order == ["first", "second"]
    assert admission.running == 2


async def test_full_queue_refuses_at_once() -> None:
    admission = controller(max_waiting=1)
    await admission.admit(2, 10)
    waiter = asyncio.create_task(admission.admit(1, 10))
    await asyncio.sleep(0)
    with pytest.raises(OverloadedError) as refused:
        await admission.admit(1, 10)
    assert refused.value.retry_after_s >= 1
    waiter.cancel()


async def test_waiting_prompt_tokens_are_bounded() -> None:
    admission = controller(max_waiting_prompt_tokens=100)
    await admission.admit(2, 10)
    waiter = asyncio.create_task(admission.admit(1, 80))
    await asyncio.sleep(0)
    with pytest.raises(OverloadedError, match="prompt tokens"):
        await admission.admit(1, 30)
    waiter.cancel()


async def test_a_request_that_waits_past_the_queue_deadline_is_refused_and_leaves_the_queue() -> None:
    admission = controller(queue_timeout_s=0.05)
    await admission.admit(2, 10)
    with pytest.raises(OverloadedError, match="waited"):
        await admission.admit(1, 10)
    assert admission.waiting == 0


async def test_a_cancelled_waiter_leaves_the_queue_and_takes_no_slot() -> None:
    admission = controller()
    await admission.admit(2, 10)
    waiter = asyncio.create_task(admission.admit(1, 10))
    await asyncio.sleep(0)
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert admission.waiting == 0
    admission.release(2)
    assert admission.running == 0


async def test_wait_is_estimated_from_the_drain_rate_and_hopeless_requests_are_shed_at_once() -> None:
    clock = FakeClock()
    admission = controller(clock, max_in_flight=1, max_waiting=100, queue_timeout_s=2.5)
    for _ in range(4):  # one completion per second observed
        await admission.admit(1, 1)
        clock.now += 1.0
        admission.release(1)
    await admission.admit(1, 1)
    waiters = [asyncio.create_task(admission.admit(1, 1)) for _ in range(2)]
    await asyncio.sleep(0)
    estimate = admission.estimated_wait_s()
    assert estimate is not None
    assert estimate == pytest.approx(3.0)  # 2 waiting + itself, at 4 completions in the 4 s observed
    with pytest.raises(OverloadedError, match=r"would wait about 3\.0 s") as shed:
        admission.check_fast()
    assert shed.value.retry_after_s == 3
    for waiter in waiters:
        waiter.cancel()


async def test_without_shedding_by_estimate_only_hard_limits_refuse() -> None:
    clock = FakeClock()
    admission = controller(clock, max_in_flight=1, max_waiting=100, shed_by_estimate=False)
    await admission.admit(1, 1)
    clock.now += 100
    admission.release(1)
    await admission.admit(1, 1)
    admission.check_fast()


async def test_overload_over_http_is_a_fast_429_with_retry_after() -> None:
    engine = FakeEngine()
    engine.token_delay_s = 0.05
    overrides = parse_overrides(["admission.max_in_flight=1", "admission.max_waiting=1"])
    app = create_app(load_config(None, overrides), engine_starter=fake_starter(engine), on_fatal=lambda: None)
    async with app.router.lifespan_context(app):
        while not app.state.runtime.is_ready:  # noqa: ASYNC110 - the runtime owns this flag
            await asyncio.sleep(0.01)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=30) as client:
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
    assert app.state.permits.admission.running == 0
