"""A response that is not streamed takes each choice whole from vLLM (no output per token), and
still teaches the metrics and admission when its tokens were made."""

from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client import CollectorRegistry
from vllm.sampling_params import RequestOutputKind
from vllm.v1.metrics.stats import RequestStateStats

from llmserve.config import AdmissionConfig, SloConfig
from llmserve.engine.base import SamplingSpec, TokenTiming
from llmserve.engine.vllm_engine import to_sampling_params, token_timing
from llmserve.metrics import GatewayMetrics, RequestObservation
from llmserve.policy.admission import Admission
from llmserve.policy.service_model import ServiceModel

ROUTE = "/v1/completions"


def test_only_streamed_requests_ask_vllm_for_every_token() -> None:
    streamed = to_sampling_params(SamplingSpec(max_tokens=8))
    whole = to_sampling_params(SamplingSpec(max_tokens=8, incremental=False))
    assert streamed.output_kind == RequestOutputKind.DELTA
    assert whole.output_kind == RequestOutputKind.FINAL_ONLY
    assert whole.skip_clone  # made for one request: vLLM need not deep-copy it


def test_vllm_request_stats_place_the_first_and_last_token_before_now() -> None:
    stats = RequestStateStats(arrival_time=time.time() - 2.0)
    stats.first_token_latency = 0.5  # 1.5 s ago
    stats.first_token_ts, stats.last_token_ts = 100.0, 101.2  # engine core clock: 1.2 s of decode
    timing = token_timing(stats)
    assert timing is not None
    assert timing.first_token_ago_s == pytest.approx(1.5, abs=0.05)
    assert timing.last_token_ago_s == pytest.approx(0.3, abs=0.05)
    assert token_timing(None) is None  # an engine that keeps no stats: the tokens count as just made


def test_a_choice_delivered_whole_gives_its_first_token_time_and_count_minus_one_gaps() -> None:
    metrics = GatewayMetrics("m", CollectorRegistry())
    observation = RequestObservation(metrics, ROUTE)
    observation.arrived_at = time.perf_counter() - 3.0
    observation.on_tokens(0, 5, TokenTiming(first_token_ago_s=2.0, last_token_ago_s=0.0))

    def sample(name: str) -> float:
        value = metrics.registry.get_sample_value(name, {"model": "m", "route": ROUTE})
        assert value is not None
        return value

    assert sample("llmserve_time_to_first_token_seconds_sum") == pytest.approx(1.0, abs=0.05)
    assert sample("llmserve_inter_token_latency_seconds_count") == 4
    assert sample("llmserve_inter_token_latency_seconds_sum") == pytest.approx(2.0, abs=0.05)
    assert sample("llmserve_generation_tokens_total") == 5


def test_a_running_request_that_delivers_nothing_yet_is_reckoned_along_by_its_time_in_the_engine() -> None:
    async def scenario() -> None:
        now = [1000.0]
        model = ServiceModel()
        queue = Admission(AdmissionConfig(), SloConfig(), model, lambda: now[0])
        ticket = queue.ticket(1, 10, 100)
        await queue.admit(ticket)
        step = 0.1
        assert ticket.remaining_tokens(now[0], step) == ticket.expected_tokens
        now[0] += 30 * step  # 30 steps later, not a token delivered (a response not streamed)
        assert ticket.remaining_tokens(now[0], step) == ticket.expected_tokens - 30
        ticket.generated = 50  # a stream that is further along counts what it delivered
        assert ticket.remaining_tokens(now[0], step) == ticket.expected_tokens - 50
        now[0] += 1000 * step
        assert ticket.remaining_tokens(now[0], step) == 1

    asyncio.run(scenario())
