"""/v1/completions against the real server: real vLLM, real SmolLM2, the official openai client."""

from __future__ import annotations

import asyncio
import itertools
import json
import time

import httpx
import openai
import pytest
from loadtest.server_process import REPO, ServerProcess

from tests.integration.conftest import MODEL, eventually
from tests.integration.test_metrics_real_engine import wait_idle

GREEDY = {"temperature": 0.0}


@pytest.fixture(scope="module")
def tokenizer():  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(REPO / ".cache/models/SmolLM2-135M-Instruct")


def test_server_announces_where_it_listens_and_when_it_is_ready(server: ServerProcess) -> None:
    log = server.log()
    assert f"starting on http://127.0.0.1:{server.port}" in log
    assert f"llmserve ready on http://127.0.0.1:{server.port}" in log


def test_health_ready_and_models(server: ServerProcess, client: openai.OpenAI) -> None:
    assert httpx.get(f"{server.base_url}/health").json() == {"status": "ok"}
    assert httpx.get(f"{server.base_url}/ready").json() == {"status": "ready"}
    assert [model.id for model in client.models.list()] == [MODEL]


@pytest.mark.dtype_sensitive
def test_greedy_completion_knows_the_capital_of_france(client: openai.OpenAI) -> None:
    completion = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=8, **GREEDY
    )
    assert "Paris" in completion.choices[0].text
    assert completion.object == "text_completion"
    assert completion.id.startswith("cmpl-")
    assert completion.choices[0].finish_reason in {"stop", "length"}


def test_stream_yields_the_same_text_as_non_stream_under_greedy(fp32_client: openai.OpenAI) -> None:
    prompt = "Once upon a time, in a small village,"
    whole = fp32_client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, **GREEDY)
    chunks = list(
        fp32_client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, stream=True, **GREEDY)
    )
    assert "".join(chunk.choices[0].text for chunk in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_include_usage_gives_exact_token_counts(client: openai.OpenAI, tokenizer) -> None:  # type: ignore[no-untyped-def]
    prompt = "List three colours of the rainbow:"
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt=prompt,
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
            **GREEDY,
        )
    )
    usage = chunks[-1].usage
    assert usage is not None
    assert chunks[-1].choices == []
    assert usage.prompt_tokens == len(tokenizer.encode(prompt))
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, **GREEDY)
    assert usage.completion_tokens == whole.usage.completion_tokens
    if whole.choices[0].finish_reason == "length":
        assert usage.completion_tokens == 12
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_list_of_prompts_gives_one_choice_each_with_its_index(fp32_client: openai.OpenAI) -> None:
    prompts = ["The capital of France is", "1, 2, 3, 4,", "Red, green,"]
    completion = fp32_client.completions.create(model=MODEL, prompt=prompts, max_tokens=6, **GREEDY)
    assert [choice.index for choice in completion.choices] == [0, 1, 2]
    for prompt, choice in zip(prompts, completion.choices, strict=True):
        alone = fp32_client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, **GREEDY)
        assert choice.text == alone.choices[0].text


def test_token_id_prompt_matches_text_prompt(fp32_client: openai.OpenAI, tokenizer) -> None:  # type: ignore[no-untyped-def]
    prompt = "The capital of France is"
    by_text = fp32_client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, **GREEDY)
    by_ids = fp32_client.completions.create(
        model=MODEL, prompt=tokenizer.encode(prompt), max_tokens=6, **GREEDY
    )
    assert by_ids.choices[0].text == by_text.choices[0].text


def test_stop_and_seed_are_honoured(fp32_client: openai.OpenAI) -> None:
    stopped = fp32_client.completions.create(
        model=MODEL, prompt="1, 2, 3, 4,", max_tokens=30, stop=["7"], **GREEDY
    )
    assert "7" not in stopped.choices[0].text
    assert stopped.choices[0].finish_reason == "stop"
    sampled = [
        fp32_client.completions.create(
            model=MODEL, prompt="My favourite food is", max_tokens=16, temperature=1.0, seed=1234
        )
        .choices[0]
        .text
        for _ in range(2)
    ]
    assert sampled[0] == sampled[1]


async def test_32_concurrent_requests_all_succeed(async_client: openai.AsyncOpenAI) -> None:
    async def one(index: int) -> openai.types.Completion:
        return await async_client.completions.create(
            model=MODEL, prompt=f"Request number {index} says", max_tokens=16, **GREEDY
        )

    completions = await asyncio.gather(*(one(i) for i in range(32)))
    assert len(completions) == 32
    assert all(c.usage and c.usage.completion_tokens > 0 for c in completions)
    assert len({c.id for c in completions}) == 32


# ignore_eos: the request runs for its full ~1500 tokens (minutes here), whatever the model says.
LONG_GENERATION = {
    "model": MODEL,
    "prompt": "1, 2, 3, 4, 5,",
    "max_tokens": 1500,
    "temperature": 0,
    "ignore_eos": True,
}


def test_client_disconnect_mid_stream_aborts_the_engine_request(server: ServerProcess) -> None:
    wait_idle(server, timeout_s=10)
    with httpx.stream(
        "POST", f"{server.base_url}/v1/completions", json={**LONG_GENERATION, "stream": True}
    ) as response:
        assert response.status_code == 200, response.read()
        # Hold the line iterator: abandoning it mid-loop finalizes it, and httpx then closes the
        # connection, so the client would already have left before the check below.
        lines = response.iter_lines()
        first_events = [line for line in itertools.islice(lines, 6) if line]
        assert len(first_events) == 3
        assert all(line.startswith("data: {") for line in first_events)
        assert eventually(server.engine_requests, timeout_s=10) == 1, "the engine runs it, client still there"
        response.close()
    wait_idle(server, timeout_s=10)
    tokens_after_abort = server.metric("vllm:generation_tokens_total")
    time.sleep(1.0)
    assert server.metric("vllm:generation_tokens_total") == tokens_after_abort


def test_client_disconnect_without_stream_aborts_the_engine_request(server: ServerProcess) -> None:
    wait_idle(server, timeout_s=10)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.base_url}/v1/completions", json=LONG_GENERATION, timeout=2.0)
    wait_idle(server, timeout_s=10)


def post(server: ServerProcess, body: object) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(
        f"{server.base_url}/v1/completions",
        content=content,
        headers={"content-type": "application/json"},
        timeout=30,
    )


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b'{"model": "SmolLM2-135M-Instruct", "prompt": ', 400, "invalid_json"),
        ({"model": "gpt-4", "prompt": "hi"}, 404, "model_not_found"),
        ({"model": MODEL, "prompt": "hi", "max_tokens": 2048}, 400, "context_length_exceeded"),
        ({"model": MODEL, "prompt": "word " * 3000}, 400, "context_length_exceeded"),
        ({"model": MODEL, "prompt": "hi", "temperature": -0.5}, 400, "invalid_value"),
        ({"model": MODEL, "prompt": "hi", "top_p": 0}, 400, "invalid_value"),
        ({"model": MODEL, "prompt": "hi", "max_tokens": 0}, 400, "invalid_value"),
        ({"model": MODEL, "prompt": ""}, 400, "invalid_value"),
        ({"model": MODEL, "prompt": [1, 49152]}, 400, "invalid_value"),
        ({"model": MODEL, "prompt": "hi", "n": 99}, 400, "invalid_value"),
        ({"model": MODEL, "prompt": "hi", "best_of": 2}, 400, "unsupported_parameter"),
    ],
)
def test_bad_input_gets_its_status_and_an_openai_error_body(
    server: ServerProcess, body: object, status: int, code: str
) -> None:
    response = post(server, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code
    assert set(error) == {"message", "type", "param", "code"}


def test_context_length_error_gives_the_numbers(server: ServerProcess) -> None:
    message = post(server, {"model": MODEL, "prompt": "hi", "max_tokens": 2048}).json()["error"]["message"]
    assert "2048" in message
    assert "2049" in message


def test_openai_client_raises_typed_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="hi")
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="hi", max_tokens=5000)


def test_server_is_healthy_after_all_of_the_above(server: ServerProcess, client: openai.OpenAI) -> None:
    assert httpx.get(f"{server.base_url}/health").status_code == 200
    completion = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=4, **GREEDY
    )
    assert completion.choices[0].text


def test_oversized_body_is_413_before_any_work(server: ServerProcess) -> None:
    body = json.dumps({"model": MODEL, "prompt": "word " * 300_000}).encode()
    assert len(body) > 1 << 20
    response = post(server, body)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"
