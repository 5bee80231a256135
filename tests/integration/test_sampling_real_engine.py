"""Every completion parameter does what it says, checked on the real engine's behaviour."""

from __future__ import annotations

import httpx
import openai
import pytest
from loadtest.server_process import REPO, ServerProcess

from tests.integration.conftest import MODEL

GREEDY = {"temperature": 0.0}
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def tokenizer():  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(REPO / ".cache/models/SmolLM2-135M-Instruct")


def greedy_text(client: openai.OpenAI, prompt: str = PROMPT, max_tokens: int = 12) -> str:
    return (
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, **GREEDY).choices[0].text
    )


@pytest.mark.parametrize(
    "narrowing",
    [{"top_k": 1}, {"top_p": 1e-6}, {"min_p": 1.0}],
    ids=["top_k=1", "top_p=tiny", "min_p=1"],
)
def test_sampling_narrowed_to_one_token_is_greedy(
    fp32_client: openai.OpenAI, narrowing: dict[str, float]
) -> None:
    top_p = narrowing.get("top_p")
    extra = {key: value for key, value in narrowing.items() if key != "top_p"}
    sampled = fp32_client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=12, temperature=1.0, seed=99, top_p=top_p, extra_body=extra
    )
    assert sampled.choices[0].text == greedy_text(fp32_client)


@pytest.mark.dtype_sensitive
def test_penalties_change_a_repetitive_continuation(client: openai.OpenAI) -> None:
    prompt = "apple apple apple apple apple apple"
    plain = greedy_text(client, prompt, 16)
    for penalty in (
        {"frequency_penalty": 2.0},
        {"presence_penalty": 2.0},
        {"extra_body": {"repetition_penalty": 2.0}},
    ):
        penalised = (
            client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, **GREEDY, **penalty)
            .choices[0]
            .text
        )
        assert penalised != plain, penalty
        assert penalised.count("apple") < plain.count("apple") or "apple" not in plain, penalty


@pytest.mark.dtype_sensitive
def test_logit_bias_forces_a_token(client: openai.OpenAI, tokenizer) -> None:  # type: ignore[no-untyped-def]
    token_id = tokenizer.encode(" banana")[0]
    forced = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=4, logit_bias={str(token_id): 100}, **GREEDY
    )
    assert forced.choices[0].text == tokenizer.decode([token_id] * 4)


@pytest.mark.dtype_sensitive
def test_stop_token_ids_stop_before_that_token(client: openai.OpenAI, tokenizer) -> None:  # type: ignore[no-untyped-def]
    text = greedy_text(client, PROMPT, 12)
    token_ids = tokenizer.encode(text)
    stop_id = token_ids[2]
    stopped = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=12, extra_body={"stop_token_ids": [stop_id]}, **GREEDY
    )
    assert stopped.choices[0].finish_reason == "stop"
    assert stop_id not in tokenizer.encode(stopped.choices[0].text)
    assert text.startswith(stopped.choices[0].text)


@pytest.mark.dtype_sensitive
def test_completion_logprobs_shape_and_count(client: openai.OpenAI) -> None:
    completion = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, logprobs=3, **GREEDY)
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None
    assert completion.usage is not None
    assert len(logprobs.tokens or []) == completion.usage.completion_tokens == 6
    assert "".join(logprobs.tokens or []) == completion.choices[0].text
    for chosen, top in zip(logprobs.token_logprobs or [], logprobs.top_logprobs or [], strict=True):
        assert len(top) == 3
        assert chosen == pytest.approx(max(top.values()))
    offsets = logprobs.text_offset or []
    assert offsets == sorted(offsets)
    assert offsets[0] == 0


def test_echo_returns_the_prompt_and_its_logprobs(fp32_client: openai.OpenAI, tokenizer) -> None:  # type: ignore[no-untyped-def]
    completion = fp32_client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=3, echo=True, logprobs=1, **GREEDY
    )
    choice = completion.choices[0]
    assert choice.text.startswith(PROMPT)
    assert choice.text == PROMPT + greedy_text(fp32_client, PROMPT, 3)
    logprobs = choice.logprobs
    assert logprobs is not None
    prompt_len = len(tokenizer.encode(PROMPT))
    assert len(logprobs.tokens or []) == prompt_len + 3
    assert (logprobs.token_logprobs or [])[0] is None
    assert "".join(logprobs.tokens or []) == choice.text


def test_list_of_token_id_lists(fp32_client: openai.OpenAI, tokenizer) -> None:  # type: ignore[no-untyped-def]
    prompts = [tokenizer.encode(PROMPT), tokenizer.encode("1, 2, 3,")]
    completion = fp32_client.completions.create(model=MODEL, prompt=prompts, max_tokens=4, **GREEDY)
    assert [choice.index for choice in completion.choices] == [0, 1]
    assert completion.choices[0].text == greedy_text(fp32_client, PROMPT, 4)


@pytest.mark.dtype_sensitive
def test_omitted_max_tokens_is_16_and_null_fills_the_context_window(server: ServerProcess, tokenizer) -> None:  # type: ignore[no-untyped-def]
    url = f"{server.base_url}/v1/completions"
    long_prompt = tokenizer.encode("word " * 2040)[:2040]
    for fields, completion_tokens in (
        ({"prompt": PROMPT}, 16),
        ({"prompt": long_prompt, "max_tokens": None}, 2048 - 2040),
    ):
        body = {"model": MODEL, "ignore_eos": True, **GREEDY, **fields}
        response = httpx.post(url, json=body, timeout=120)
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] == completion_tokens


def test_echo_with_max_tokens_0_scores_the_prompt(fp32_client: openai.OpenAI, tokenizer) -> None:  # type: ignore[no-untyped-def]
    """What lm-evaluation-harness-style clients send to score text: the prompt back, with logprobs."""
    scored = fp32_client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0, echo=True, logprobs=1)
    choice = scored.choices[0]
    assert choice.text == PROMPT
    logprobs = choice.logprobs
    assert logprobs is not None
    assert len(logprobs.tokens or []) == len(tokenizer.encode(PROMPT))
    token_logprobs = logprobs.token_logprobs or []
    assert token_logprobs[0] is None
    assert all(value is not None and value <= 0 for value in token_logprobs[1:])
    # The same positions' logprobs as when the prompt is echoed before a generated token.
    generated = fp32_client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=1, echo=True, logprobs=1, **GREEDY
    )
    assert generated.choices[0].logprobs is not None
    with_token = generated.choices[0].logprobs.token_logprobs or []
    assert with_token[1 : len(token_logprobs)] == pytest.approx(token_logprobs[1:], abs=1e-4)


@pytest.mark.dtype_sensitive
def test_logprobs_0_lists_the_sampled_token_at_every_position(client: openai.OpenAI) -> None:
    completion = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, logprobs=0)
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None
    for token, value, top in zip(
        logprobs.tokens or [], logprobs.token_logprobs or [], logprobs.top_logprobs or [], strict=True
    ):
        assert top == {token: value}, "the sampled token is always listed, as OpenAI does"


def test_n_with_streaming_completions_labels_choices(client: openai.OpenAI) -> None:
    texts: dict[int, str] = {}
    for chunk in client.completions.create(
        model=MODEL, prompt=PROMPT, n=3, max_tokens=6, temperature=1.0, seed=1, stream=True
    ):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
    assert set(texts) == {0, 1, 2}


def test_user_and_unknown_fields_are_accepted(server: ServerProcess) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 2, "user": "u-1", "brand_new_openai_field": 1}
    assert httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=30).status_code == 200


@pytest.mark.parametrize(("extra", "param"), [({"best_of": 2}, "best_of"), ({"suffix": "x"}, "suffix")])
def test_unsupported_completion_fields_are_400_naming_them(
    server: ServerProcess, extra: dict[str, object], param: str
) -> None:
    body = {"model": MODEL, "prompt": PROMPT, **extra}
    response = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=30)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param


def test_x_request_id_is_echoed(server: ServerProcess) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    response = httpx.post(
        f"{server.base_url}/v1/chat/completions", json=body, headers={"x-request-id": "abc-1"}, timeout=30
    )
    assert response.headers["x-request-id"] == "abc-1"
