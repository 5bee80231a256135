"""When the API process itself is saturated (its event loop runs behind), new generation requests
are refused at once, before their body is read: the engine's service model cannot see that."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from starlette.types import Message, Receive, Scope, Send

from llmserve.api.load_shed import LoadShedMiddleware
from llmserve.config import AdmissionConfig, SloConfig
from llmserve.errors import OverloadedError
from llmserve.policy.admission import Admission
from llmserve.policy.loop_lag import EventLoopLag


def test_the_lag_rises_with_a_blocked_loop_and_fades_once_it_keeps_time() -> None:
    async def scenario() -> tuple[float, float]:
        lag = EventLoopLag()
        lag.watch(asyncio.get_running_loop())
        await asyncio.sleep(0.05)
        time.sleep(0.12)  # noqa: ASYNC251  # a backlog: nothing runs on the loop for 120 ms
        await asyncio.sleep(0.015)
        blocked = lag.lag_s
        await asyncio.sleep(0.5)
        return blocked, lag.lag_s

    blocked, recovered = asyncio.run(scenario())
    assert blocked > 0.08
    assert recovered < 0.01


def test_admission_refuses_at_the_door_past_a_tenth_of_the_e2e_target_by_default() -> None:
    async def scenario() -> None:
        admission = Admission(AdmissionConfig(), SloConfig(e2e_s=0.2))
        assert admission.front_end_refusal() is None
        admission.loop_lag.lag_s = 0.021
        refusal = admission.front_end_refusal()
        assert isinstance(refusal, OverloadedError)
        assert refusal.retry_after_s == 1
        assert refusal.rejection == "front_end_overloaded"  # counted apart from the engine's
        with pytest.raises(OverloadedError, match="front end runs 21 ms behind"):
            admission.check(admission.ticket(1, 10, 10))
        # Without an e2e target (and no max_loop_lag_s) lag never refuses; an explicit one does.
        untargeted = Admission(AdmissionConfig(), SloConfig())
        untargeted.loop_lag.lag_s = 5.0
        assert untargeted.front_end_refusal() is None
        explicit = Admission(AdmissionConfig(max_loop_lag_s=0.5), SloConfig())
        assert explicit.front_end_refusal() is None  # watching the loop from now on
        explicit.loop_lag.lag_s = 0.6
        assert explicit.front_end_refusal() is not None

    asyncio.run(scenario())


def test_the_middleware_answers_429_before_reading_the_body_and_lets_the_rest_through() -> None:
    async def scenario() -> None:
        admission = Admission(AdmissionConfig(), SloConfig(e2e_s=0.2))
        reached: list[str] = []

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            reached.append(scope["path"])

        async def receive() -> Message:
            raise AssertionError("the body was read")

        async def call(path: str) -> list[Message]:
            sent: list[Message] = []

            async def send(message: Message) -> None:
                sent.append(message)

            scope = {"type": "http", "method": "POST", "path": path, "headers": [], "state": {}}
            await LoadShedMiddleware(app, admission)(scope, receive, send)
            return sent

        assert await call("/v1/completions") == []  # not saturated: through to the app
        admission.loop_lag.lag_s = 1.0
        sent = await call("/v1/chat/completions")
        assert sent[0]["status"] == 429
        assert (b"retry-after", b"1") in sent[0]["headers"]
        assert json.loads(sent[1]["body"])["error"]["code"] == "overloaded"
        assert await call("/health") == []  # probes and scrapes are never shed
        assert reached == ["/v1/completions", "/health"]

    asyncio.run(scenario())
