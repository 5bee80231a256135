"""One request's permit, driven through the Pipeline with FakeEngine: whatever ends the request,
its permit is released exactly once, the admission queue gets its slots back and the key its
unused tokens, and a request refused before any work costs its key nothing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from starlette.requests import Request

from llmserve.config import Config, load_config, parse_overrides
from llmserve.errors import (
    DrainingError,
    InvalidParameterError,
    OverloadedError,
    RateLimitedError,
    RequestTimeoutError,
)
from llmserve.metrics import GatewayMetrics, RequestObservation
from llmserve.policy.admission import Admission
from llmserve.policy.permits import Cost, Permit, Permits
from llmserve.policy.rate_limits import KeyLimits, RateLimiter
from llmserve.protocol.completions import CompletionRequest
from llmserve.serving.completions import CompletionService
from llmserve.serving.event_stream import EventStream
from llmserve.serving.pipeline import Pipeline
from tests.fake_engine import FakeEngine
from tests.unit.conftest import MODEL

KEY = "key-1"
ROUTE = "/v1/completions"


class ReadyRuntime:
    def __init__(self, engine: FakeEngine) -> None:
        self._engine = engine

    def engine(self) -> FakeEngine:
        return self._engine


@dataclass
class Client:
    """An HTTP client as the pipeline sees it: a receive channel it can disconnect through."""

    left: asyncio.Event = field(default_factory=asyncio.Event)

    async def receive(self) -> dict[str, Any]:
        await self.left.wait()
        return {"type": "http.disconnect"}

    def request(self) -> Request:
        return Request({"type": "http", "method": "POST", "path": ROUTE, "headers": []}, self.receive)


@dataclass
class Harness:
    config: Config
    engine: FakeEngine
    admission: Admission
    limiter: RateLimiter
    permits: Permits
    pipeline: Pipeline
    service: CompletionService
    metrics: GatewayMetrics
    released: list[Permit] = field(default_factory=list)

    @property
    def key(self) -> KeyLimits:
        key = self.limiter.limits_of(KEY)
        assert key is not None
        return key

    def serve(self, client: Client, **fields: Any) -> asyncio.Task[Any]:
        body = CompletionRequest.model_validate(
            {"model": MODEL, "prompt": "a b c", "max_tokens": 4, **fields}
        )
        observation = RequestObservation(self.metrics, ROUTE)
        return asyncio.create_task(
            self.pipeline.serve(client.request(), body, self.service, KEY, observation)
        )

    def assert_nothing_held(self, *, requests_left: float, tokens_left: float | None) -> None:
        assert self.permits.in_flight() == 0
        assert (self.admission.running, self.admission.waiting) == (0, 0)
        assert self.released
        assert all(permit.released for permit in self.released)
        assert self.key.requests is not None
        assert self.key.tokens is not None
        assert self.key.requests.level == pytest.approx(requests_left, abs=0.01)
        if tokens_left is not None:
            assert self.key.tokens.level == pytest.approx(tokens_left, abs=1)


@asynccontextmanager
async def harness(*settings: str, engine: FakeEngine | None = None) -> AsyncIterator[Harness]:
    config = load_config(
        None,
        parse_overrides(
            [
                "auth.requests_per_minute=10",
                "auth.tokens_per_minute=1000",
                "admission.max_in_flight=1",
                "admission.max_waiting=4",
                *settings,
            ]
        ),
    )
    fake = engine or slow_engine(0)
    admission = Admission(config.admission, config.slo)
    limiter = RateLimiter(config.auth, clock=lambda: 0.0)  # no refills: every token is accounted for
    permits = Permits(admission, limiter)
    pipeline = Pipeline(config, ReadyRuntime(fake), permits)  # type: ignore[arg-type]
    service = CompletionService(MODEL, config.admission.max_prompt_tokens)
    test = Harness(config, fake, admission, limiter, permits, pipeline, service, GatewayMetrics(MODEL))
    issue = permits.issue

    def issue_and_track(*args: Any) -> Permit:
        permit = issue(*args)
        test.released.append(permit)
        return permit

    permits.issue = issue_and_track  # type: ignore[method-assign]
    yield test


def slow_engine(token_delay_s: float) -> FakeEngine:
    engine = FakeEngine(max_model_len=4096)
    engine.token_delay_s = token_delay_s
    return engine


async def eventually(condition: Callable[[], object], timeout_s: float = 2.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition never held"
        await asyncio.sleep(0.005)


async def test_a_request_refused_by_planning_gives_its_request_and_tokens_back() -> None:
    async with harness() as test:
        for _ in range(15):  # more than the key's 10 requests per minute
            with pytest.raises(InvalidParameterError):
                await test.serve(Client(), prompt=[5, 10**6])  # out of the vocabulary
        test.assert_nothing_held(requests_left=10, tokens_left=1000)
        await test.serve(Client())
        test.assert_nothing_held(requests_left=9, tokens_left=1000 - 3 - 4)  # prompt + 4 generated


async def test_a_request_refused_by_admission_gives_its_request_and_tokens_back() -> None:
    engine = slow_engine(0.05)
    async with harness("admission.max_waiting=0", engine=engine) as test:
        running = test.serve(Client(), max_tokens=20)
        await eventually(lambda: test.admission.running == 1)
        with pytest.raises(OverloadedError):
            await test.serve(Client())
        await running
        test.assert_nothing_held(requests_left=9, tokens_left=1000 - 3 - 20)


async def test_a_refusal_is_decided_without_waiting_for_a_turn_of_the_event_loop() -> None:
    """Under load every turn of the loop waits behind the streams' work: a door refusal that took
    turns waited 6 ms at the median for 0.4 ms of its own."""
    engine = slow_engine(0.05)
    # Refused once planned (its 3 prompt tokens may not wait), not by the probe before planning.
    async with harness("admission.max_waiting_prompt_tokens=2", engine=engine) as test:
        running = test.serve(Client(), max_tokens=20)
        await eventually(lambda: test.admission.running == 1)
        body = CompletionRequest.model_validate({"model": MODEL, "prompt": "a b c", "max_tokens": 4})
        observation = RequestObservation(test.metrics, ROUTE)
        request = test.pipeline.serve(Client().request(), body, test.service, KEY, observation)
        with pytest.raises(OverloadedError):
            request.send(None)  # its first step, without yielding once, ends in the refusal
        await running
        test.assert_nothing_held(requests_left=9, tokens_left=1000 - 3 - 20)


async def test_a_request_whose_max_tokens_cannot_be_served_in_time_is_refused_before_tokenizing() -> None:
    engine = slow_engine(0.05)
    tokenized: list[str] = []
    tokenize = engine.tokenize

    async def counting_tokenize(text: str) -> Any:
        tokenized.append(text)
        return await tokenize(text)

    engine.tokenize = counting_tokenize  # type: ignore[method-assign]
    # The prior service model: ~0.05 s a step. The running request keeps the one place ~1 s; a
    # one-token request could wait that long within 2 s, one of 25 tokens (~1.25 s) could not.
    async with harness("slo.e2e_s=2", engine=engine) as test:
        running = test.serve(Client(), prompt="a b c", max_tokens=20)
        await eventually(lambda: test.admission.running == 1)
        with pytest.raises(OverloadedError):
            await test.serve(Client(), prompt="never tokenized", max_tokens=25)
        assert "never tokenized" not in tokenized
        await running


async def test_a_queued_request_cancelled_before_it_could_wait_leaves_the_queue_or_gives_its_room_back() -> (
    None
):
    async with harness() as test:
        blocker = test.permits.issue(ROUTE, KEY, 60, RequestObservation(test.metrics, ROUTE))
        blocker.reserve(Cost(1, 3, 4))
        assert blocker.admit_now()
        for admitted_meanwhile in (False, True):
            queued = test.permits.issue(ROUTE, KEY, 60, RequestObservation(test.metrics, ROUTE))
            queued.reserve(Cost(1, 3, 4))
            assert not queued.admit_now()
            assert test.admission.waiting == 1
            if admitted_meanwhile:  # the blocker ends: the queued ticket is admitted, nobody waits
                blocker.release(completed=True)
                assert (test.admission.running, test.admission.waiting) == (1, 0)
            queued.release(completed=False)  # its waiter was cancelled before it ran
            assert test.admission.waiting == 0
        test.assert_nothing_held(requests_left=10, tokens_left=1000)  # none of them did any work


async def test_over_the_keys_tokens_is_refused_and_costs_nothing() -> None:
    async with harness() as test:
        with pytest.raises(RateLimitedError):
            await test.serve(Client(), max_tokens=2000)
        test.assert_nothing_held(requests_left=10, tokens_left=1000)


async def test_a_client_leaving_while_queued_takes_its_request_out_and_costs_nothing() -> None:
    engine = slow_engine(0.05)
    async with harness(engine=engine) as test:
        running = test.serve(Client(), max_tokens=10)
        await eventually(lambda: test.admission.running == 1)
        client = Client()
        queued = test.serve(client)
        await eventually(lambda: test.admission.waiting == 1)
        client.left.set()
        assert (await queued).status_code == 499
        assert test.admission.waiting == 0, "out of the queue when the answer is given"
        await running
        test.assert_nothing_held(requests_left=9, tokens_left=1000 - 3 - 10)


async def test_a_request_cancelled_while_planning_releases_its_permit() -> None:
    engine = slow_engine(0)
    planning = asyncio.Event()
    tokenize = engine.tokenize

    async def slow_tokenize(text: str) -> Any:
        planning.set()
        await asyncio.sleep(60)
        return await tokenize(text)

    engine.tokenize = slow_tokenize  # type: ignore[method-assign]
    async with harness(engine=engine) as test:
        task = test.serve(Client())
        await planning.wait()
        task.cancel()  # the server stopping, say
        with pytest.raises(asyncio.CancelledError):
            await task
        test.assert_nothing_held(requests_left=10, tokens_left=1000)


async def test_a_client_leaving_mid_stream_stops_the_producer_and_releases_the_permit() -> None:
    engine = slow_engine(0.02)
    async with harness(engine=engine) as test:
        client = Client()
        response = await test.serve(client, max_tokens=500, stream=True)
        assert isinstance(response, EventStream)
        tasks_before = asyncio.all_tasks()
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)
            if len(sent) == 4:  # the status line and three events
                client.left.set()

        scope = {"type": "http", "asgi": {"spec_version": "2.3"}, "method": "POST", "path": ROUTE}
        await response(scope, client.receive, send)
        await eventually(lambda: test.permits.in_flight() == 0)
        assert engine.aborted, "the engine request was aborted"
        test.assert_nothing_held(requests_left=9, tokens_left=None)
        used = 1000 - test.key.tokens.level  # type: ignore[union-attr]
        assert 3 + 3 <= used < 3 + 20, "the prompt and what was generated; the rest of 500 is refunded"
        left_pending = [task for task in asyncio.all_tasks() - tasks_before if not task.done()]
        assert left_pending == [], "no task left waiting (asyncio logs those as destroyed)"


async def test_a_request_at_its_deadline_is_answered_504_and_releases_everything() -> None:
    engine = slow_engine(0.05)
    async with harness(engine=engine) as test:
        with pytest.raises(RequestTimeoutError):
            await test.serve(Client(), max_tokens=100, timeout=0.2)
        assert engine.aborted
        used = test.config.auth.tokens_per_minute - test.key.tokens.level  # type: ignore[operator, union-attr]
        assert 3 < used < 3 + 100, "it keeps what it generated before the deadline, not its reservation"
        test.assert_nothing_held(requests_left=9, tokens_left=1000 - used)


async def test_a_drain_cuts_running_and_queued_requests_and_releases_everything() -> None:
    engine = slow_engine(0.05)
    async with harness(engine=engine) as test:
        running = test.serve(Client(), max_tokens=200)
        await eventually(lambda: test.admission.running == 1)
        queued = test.serve(Client(), max_tokens=200)
        await eventually(lambda: test.admission.waiting == 1)
        test.permits.drain(0.2)
        for task in (running, queued):
            with pytest.raises(DrainingError):
                await task
        assert test.permits.in_flight() == 0
        assert (test.admission.running, test.admission.waiting) == (0, 0)
        assert all(permit.released for permit in test.released)


async def test_a_permit_is_released_exactly_once() -> None:
    async with harness() as test:
        permit = test.permits.issue(ROUTE, KEY, 10, RequestObservation(test.metrics, ROUTE))
        permit.release(completed=False)
        with pytest.raises(RuntimeError, match="exactly once"):
            permit.release(completed=False)
