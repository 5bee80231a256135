"""Gateway metrics with FakeEngine: after a known set of requests every count is exact."""

from __future__ import annotations

from fastapi.testclient import TestClient
from loadtest.prom import Scrape, delta
from prometheus_client import generate_latest

from llmserve.metrics import LATENCY_BUCKETS_S, REJECTION_REASONS, GatewayMetrics, route_label
from tests.unit.conftest import MODEL

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"


def scrape(client: TestClient) -> Scrape:
    return Scrape.parse(client.get("/metrics").text)


def test_slo_edges_are_bucket_edges() -> None:
    assert {0.05, 0.1, 0.2, 0.5} <= set(LATENCY_BUCKETS_S)


def test_unknown_paths_share_one_route_label() -> None:
    assert route_label("/v1/completions") == "/v1/completions"
    assert route_label("/wp-admin/x.php") == "other"


def test_known_mix_of_requests_gives_exact_counts(client: TestClient) -> None:
    before = scrape(client)
    ok = [
        client.post(COMPLETIONS, json={"model": MODEL, "prompt": "a b", "max_tokens": 3}),
        client.post(COMPLETIONS, json={"model": MODEL, "prompt": ["a", "b c"], "max_tokens": 2, "n": 2}),
        client.post(COMPLETIONS, json={"model": MODEL, "prompt": "a", "max_tokens": 4, "stream": True}),
        client.post(
            CHAT, json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
        ),
    ]
    assert [r.status_code for r in ok] == [200] * 4
    bad = [
        client.post(COMPLETIONS, json={"model": MODEL, "prompt": "a", "temperature": 9}),
        client.post(COMPLETIONS, json={"model": "other", "prompt": "a"}),
        client.post(CHAT, json={"model": MODEL, "messages": []}),
        client.post(COMPLETIONS, json={"model": MODEL, "prompt": "FAIL_MID_STREAM", "max_tokens": 3}),
        client.post(
            COMPLETIONS, json={"model": MODEL, "prompt": "FAIL_MID_STREAM", "max_tokens": 3, "stream": True}
        ),
    ]
    assert [r.status_code for r in bad] == [400, 404, 400, 500, 200]
    after = scrape(client)

    def d(name: str, **labels: str) -> float:
        return delta(after, before, name, model=MODEL, **labels)

    assert d("llmserve_requests_total", route=COMPLETIONS, status="200") == 4
    assert d("llmserve_requests_total", route=CHAT, status="200") == 1
    assert d("llmserve_requests_total", route=COMPLETIONS, status="400") == 1
    assert d("llmserve_requests_total", route=COMPLETIONS, status="404") == 1
    assert d("llmserve_requests_total", route=CHAT, status="400") == 1
    assert d("llmserve_requests_total", route=COMPLETIONS, status="500") == 1
    assert d("llmserve_request_errors_total", code="invalid_value") == 2
    assert d("llmserve_request_errors_total", code="model_not_found") == 1
    assert d("llmserve_request_errors_total", code="engine_error") == 2  # one JSON, one inside a stream
    # usage: 3 + (2 prompts x 2 choices x 2) + 4 + 5; the two failures fail before their first token
    assert d("llmserve_generation_tokens_total") == 3 + 8 + 4 + 5
    assert d("llmserve_prompt_tokens_total", route=COMPLETIONS) == 2 + 3 + 1 + 1 + 1
    # end-to-end latency counts only successful generation requests
    assert d("llmserve_e2e_request_latency_seconds_count", route=COMPLETIONS) == 3
    assert d("llmserve_e2e_request_latency_seconds_count", route=CHAT) == 1
    assert d("llmserve_time_to_first_token_seconds_count") == 4
    assert d("llmserve_time_to_first_token_seconds_sum") <= d("llmserve_e2e_request_latency_seconds_sum")


def test_gauges_return_to_zero_and_rejection_reasons_are_always_exported(client: TestClient) -> None:
    client.post(COMPLETIONS, json={"model": MODEL, "prompt": "a", "max_tokens": 2})
    current = scrape(client)
    assert current.value("llmserve_requests_in_flight") == 0
    for reason in REJECTION_REASONS:
        assert (
            "llmserve_rejections_total",
            frozenset({("model", MODEL), ("route", COMPLETIONS), ("reason", reason)}),
        ) in current.samples


def test_probes_and_scrapes_are_counted_but_not_as_generation_latency(client: TestClient) -> None:
    before = scrape(client)
    client.get("/health")
    client.get("/no/such/page")
    after = scrape(client)
    assert delta(after, before, "llmserve_requests_total", route="/health", status="200") == 1
    assert delta(after, before, "llmserve_requests_total", route="other", status="404") == 1
    assert delta(after, before, "llmserve_e2e_request_latency_seconds_count") == 0


def test_each_app_has_its_own_registry() -> None:
    first, second = GatewayMetrics(MODEL), GatewayMetrics(MODEL)
    assert first.registry is not second.registry


def test_a_refusal_after_waiting_is_timed_to_the_second_not_only_as_over_five_seconds() -> None:
    """A queued request refused after waiting waits up to its deadline: the refusal histogram's
    edges reach past the 5 s it once stopped at, so its p99 is a time, not a lower bound."""
    metrics = GatewayMetrics(MODEL)
    metrics.rejection_latency.labels(MODEL, "/v1/completions", "after_waiting").observe(6.0)
    scraped = Scrape.parse(generate_latest(metrics.registry).decode())
    bucket = "llmserve_rejection_latency_seconds_bucket"
    assert scraped.value(bucket, le="5.0") == 0
    assert scraped.value(bucket, le="10.0") == 1
    assert scraped.value(bucket, le="120.0") == 1
