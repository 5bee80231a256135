"""/metrics on the real server: exact gateway counts, cross-checked with vLLM's own series."""

from __future__ import annotations

import itertools

import httpx
import openai
from loadtest.prom import delta
from loadtest.server_process import ServerProcess

from tests.integration.conftest import MODEL, eventually

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
GREEDY = {"temperature": 0.0}


def wait_idle(server: ServerProcess, timeout_s: float = 15) -> None:
    """Until neither vLLM nor the gateway holds a request."""

    def idle() -> bool:
        scrape = server.scrape()
        held = ("vllm:num_requests_running", "vllm:num_requests_waiting", "llmserve_requests_in_flight")
        return all(scrape.value(name) == 0 for name in held)

    assert eventually(idle, timeout_s), "server not idle"


def test_vllm_engine_series_are_exposed_beside_the_gateway_series(server: ServerProcess) -> None:
    names = server.scrape().names()
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:num_preemptions_total",
        "vllm:time_to_first_token_seconds_count",
        "vllm:request_queue_time_seconds_count",
        "vllm:generation_tokens_total",
        "llmserve_requests_total",
        "llmserve_e2e_request_latency_seconds_bucket",
        "llmserve_time_to_first_token_seconds_bucket",
        "llmserve_accept_queue_connections",
        "llmserve_request_read_delay_seconds_bucket",
    ):
        assert name in names, name
    # Idle, nothing waits in the kernel's accept queue; its bound is the listen backlog.
    assert server.metric("llmserve_accept_queue_connections") == 0
    assert server.metric("llmserve_accept_queue_limit") > 0


def test_known_requests_give_exact_counts_that_agree_with_the_engine(
    server: ServerProcess, client: openai.OpenAI
) -> None:
    wait_idle(server)
    before = server.scrape()
    usages = [
        client.completions.create(
            model=MODEL, prompt="The capital of France is", max_tokens=8, **GREEDY
        ).usage,
        client.completions.create(
            model=MODEL, prompt=["1, 2,", "a, b,"], max_tokens=5, n=2, temperature=1.0, seed=2
        ).usage,
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=6, **GREEDY
        ).usage,
    ]
    streamed = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Hello"}],
            max_tokens=7,
            stream=True,
            stream_options={"include_usage": True},
            **GREEDY,
        )
    )
    usages.append(streamed[-1].usage)
    failures = [
        httpx.post(
            f"{server.base_url}{COMPLETIONS}", json={"model": MODEL, "prompt": "x", "max_tokens": 4096}
        ),
        httpx.post(f"{server.base_url}{COMPLETIONS}", json={"model": "nope", "prompt": "x"}),
        httpx.post(f"{server.base_url}{CHAT}", json={"model": MODEL, "messages": [{"role": "bot"}]}),
    ]
    assert [r.status_code for r in failures] == [400, 404, 400]
    wait_idle(server)
    after = server.scrape()

    def d(name: str, **labels: str) -> float:
        return delta(after, before, name, **labels)

    completion_tokens = sum(u.completion_tokens for u in usages if u)
    prompt_tokens = sum(u.prompt_tokens for u in usages if u)
    assert d("llmserve_requests_total", route=COMPLETIONS, status="200") == 2
    assert d("llmserve_requests_total", route=CHAT, status="200") == 2
    assert d("llmserve_requests_total", route=COMPLETIONS, status="400") == 1
    assert d("llmserve_requests_total", route=COMPLETIONS, status="404") == 1
    assert d("llmserve_requests_total", route=CHAT, status="400") == 1
    assert d("llmserve_request_errors_total", code="context_length_exceeded") == 1
    assert d("llmserve_request_errors_total", code="model_not_found") == 1
    assert d("llmserve_request_errors_total", code="unsupported_parameter") == 1, "a role it does not take"
    assert d("llmserve_e2e_request_latency_seconds_count") == 4
    # Every generation request, answered or not, was read: none waited long in the kernel.
    assert d("llmserve_request_read_delay_seconds_count") == 7
    assert d("llmserve_request_read_delay_seconds_sum") < 7 * 0.5
    assert d("llmserve_time_to_first_token_seconds_count") == 4
    assert d("llmserve_generation_tokens_total") == completion_tokens
    assert d("llmserve_prompt_tokens_total") == prompt_tokens
    # The engine counted the same work: 1 + 2x2 + 1 + 1 engine sequences, the same tokens.
    assert d("vllm:generation_tokens_total") == completion_tokens
    # usage counts a prompt once, as OpenAI does; vLLM counts it for each of the n=2 sequences
    assert usages[1] is not None
    assert d("vllm:prompt_tokens_total") == prompt_tokens + usages[1].prompt_tokens
    assert d("vllm:request_success_total") == 7
    assert after.value("llmserve_requests_in_flight") == 0
    assert after.value("vllm:num_requests_running") == 0


def test_time_to_first_token_never_exceeds_end_to_end(server: ServerProcess, client: openai.OpenAI) -> None:
    for max_tokens, stream in ((1, False), (16, False), (16, True), (40, True)):
        before = server.scrape()
        response = client.completions.create(
            model=MODEL, prompt="Once upon a time", max_tokens=max_tokens, stream=stream, **GREEDY
        )
        if stream:
            list(response)  # type: ignore[arg-type]
        after = server.scrape()
        ttft = delta(after, before, "llmserve_time_to_first_token_seconds_sum")
        e2e = delta(after, before, "llmserve_e2e_request_latency_seconds_sum")
        assert delta(after, before, "llmserve_e2e_request_latency_seconds_count") == 1
        assert 0 < ttft <= e2e


def test_a_response_not_streamed_still_times_its_first_token_and_each_gap(
    server: ServerProcess, client: openai.OpenAI
) -> None:
    """vLLM delivers a non-streamed choice whole (no output per token): the first token's time
    and the gaps come from vLLM's own per-request timing, not from when the answer arrived."""
    before = server.scrape()
    completion = client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=40, extra_body={"ignore_eos": True}, **GREEDY
    )
    after = server.scrape()
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 40
    ttft = delta(after, before, "llmserve_time_to_first_token_seconds_sum")
    e2e = delta(after, before, "llmserve_e2e_request_latency_seconds_sum")
    assert 0 < ttft < 0.8 * e2e  # 39 decode steps follow the first token
    assert delta(after, before, "llmserve_inter_token_latency_seconds_count") == 39
    gaps = delta(after, before, "llmserve_inter_token_latency_seconds_sum")
    assert 0 < gaps <= e2e - ttft + 0.05


def test_client_disconnect_is_counted_as_a_rejection_and_not_as_a_success(server: ServerProcess) -> None:
    wait_idle(server)
    before = server.scrape()
    body = {"model": MODEL, "prompt": "1, 2, 3, 4, 5,", "max_tokens": 1500, "stream": True, **GREEDY}
    with httpx.stream("POST", f"{server.base_url}{COMPLETIONS}", json=body) as response:
        assert any(line.startswith("data: {") for line in itertools.islice(response.iter_lines(), 4))
        response.close()  # the client leaves mid-stream
    wait_idle(server)
    after = server.scrape()
    assert delta(after, before, "llmserve_rejections_total", reason="client_disconnected") == 1
    assert delta(after, before, "llmserve_e2e_request_latency_seconds_count") == 0
    assert after.value("llmserve_requests_in_flight") == 0
