"""/v1/chat/completions against the real server with the official openai client."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from loadtest.server_process import ServerProcess

from tests.integration.conftest import MODEL

GREEDY = {"temperature": 0.0}
CAPITAL = [{"role": "user", "content": "What is the capital of France?"}]
# For the tests that assert the answer: asked bare, the greedy answer's first token is a near tie
# ("The" over "L" by 0.1 nats in float32), and bfloat16 on an Intel Xeon with AMX tipped it into
# "L'Étoile, la Marseillaise, ..."; asked for one word, no step is closer than 0.45 nats in either
# dtype, and the one that close ("The answer ...") says "Paris" too.
CAPITAL_IN_ONE_WORD = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


@pytest.mark.dtype_sensitive
def test_greedy_chat_answers_with_paris(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model=MODEL, messages=CAPITAL_IN_ONE_WORD, max_tokens=24, **GREEDY
    )
    assert completion.object == "chat.completion"
    assert completion.id.startswith("chatcmpl-")
    choice = completion.choices[0]
    assert choice.message.role == "assistant"
    assert "Paris" in (choice.message.content or "")
    assert completion.usage is not None
    assert (
        completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens
    )


def test_chat_stream_deltas_concatenate_to_the_non_stream_answer(fp32_client: openai.OpenAI) -> None:
    messages = [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "Name three fruits."},
    ]
    whole = fp32_client.chat.completions.create(model=MODEL, messages=messages, max_tokens=32, **GREEDY)
    chunks = list(
        fp32_client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=32,
            stream=True,
            stream_options={"include_usage": True},
            **GREEDY,
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert content == whole.choices[0].message.content
    finish = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices]
    assert finish[-1] == whole.choices[0].finish_reason
    assert all(reason is None for reason in finish[:-1])
    assert chunks[-1].choices == []
    assert chunks[-1].usage == whole.usage


def test_list_of_text_parts_equals_string_content(fp32_client: openai.OpenAI) -> None:
    as_string = fp32_client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello\nworld"}], max_tokens=12, **GREEDY
    )
    as_parts = fp32_client.chat.completions.create(
        model=MODEL,
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "world"}],
            }
        ],
        max_tokens=12,
        **GREEDY,
    )
    assert as_parts.choices[0].message.content == as_string.choices[0].message.content
    assert as_parts.usage == as_string.usage


@pytest.mark.dtype_sensitive
def test_json_object_response_format_parses(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "user", "content": 'Give a JSON object with a key "city" for the capital of France.'}
        ],
        response_format={"type": "json_object"},
        max_tokens=150,
        **GREEDY,
    )
    content = completion.choices[0].message.content or ""
    assert completion.choices[0].finish_reason == "stop", content
    answer = json.loads(content)
    assert isinstance(answer, dict)
    assert "Paris" in json.dumps(answer)


@pytest.mark.dtype_sensitive
def test_json_schema_response_format_matches_the_schema(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "colours": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
        },
        "required": ["name", "age", "colours"],
        "additionalProperties": False,
    }
    for temperature in (0.0, 1.0):
        completion = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Invent a person."}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "person", "schema": schema, "strict": True},
            },
            max_tokens=120,
            temperature=temperature,
            seed=3,
        )
        content = completion.choices[0].message.content or ""
        assert completion.choices[0].finish_reason == "stop", content
        jsonschema.validate(json.loads(content), schema)


def test_invalid_json_schema_is_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model=MODEL,
            messages=CAPITAL,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "bad", "schema": {"type": "no-such-type"}},
            },
            max_tokens=8,
        )


def test_n_choices_with_a_seed_are_indexed_and_reproducible(fp32_client: openai.OpenAI) -> None:
    def sample() -> list[str]:
        completion = fp32_client.chat.completions.create(
            model=MODEL, messages=CAPITAL, n=3, max_tokens=12, temperature=1.0, seed=11
        )
        assert [choice.index for choice in completion.choices] == [0, 1, 2]
        return [choice.message.content or "" for choice in completion.choices]

    first = sample()
    assert sample() == first
    assert len(set(first)) > 1, "n samples at temperature 1 should not all be equal"


def test_n_choices_stream_carry_their_index(client: openai.OpenAI) -> None:
    texts: dict[int, str] = {}
    for chunk in client.chat.completions.create(
        model=MODEL, messages=CAPITAL, n=2, max_tokens=8, temperature=1.0, seed=5, stream=True
    ):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
    assert set(texts) == {0, 1}
    assert all(texts.values())


@pytest.mark.dtype_sensitive
def test_chat_logprobs_have_one_entry_per_token(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model=MODEL, messages=CAPITAL, max_tokens=8, logprobs=True, top_logprobs=3, **GREEDY
    )
    content = completion.choices[0].logprobs.content  # type: ignore[union-attr]
    assert completion.usage is not None
    assert content is not None
    assert len(content) == completion.usage.completion_tokens
    for entry in content:
        assert len(entry.top_logprobs) == 3
        assert entry.logprob <= 0
        # greedy: the chosen token is the most likely one
        assert entry.logprob == pytest.approx(max(top.logprob for top in entry.top_logprobs))
    tokens_text = "".join(entry.token for entry in content)
    text = completion.choices[0].message.content or ""
    if completion.choices[0].finish_reason == "stop":  # the end-of-turn token is counted, not shown
        assert tokens_text == text + "<|im_end|>"
    else:
        assert tokens_text == text


@pytest.mark.dtype_sensitive
def test_ignore_eos_and_max_completion_tokens(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say hi."}],
        max_completion_tokens=40,
        extra_body={"ignore_eos": True},
        **GREEDY,
    )
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 40
    assert completion.choices[0].finish_reason == "length"


@pytest.mark.dtype_sensitive
def test_chat_stop_really_stops(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model=MODEL, messages=CAPITAL_IN_ONE_WORD, max_tokens=24, **GREEDY)
    text = whole.choices[0].message.content or ""
    stop_word = "Paris"
    assert stop_word in text
    stopped = client.chat.completions.create(
        model=MODEL, messages=CAPITAL_IN_ONE_WORD, max_tokens=24, stop=[stop_word], **GREEDY
    )
    assert stopped.choices[0].message.content == text[: text.index(stop_word)]
    assert stopped.choices[0].finish_reason == "stop"


@pytest.mark.dtype_sensitive
async def test_async_client_streams_chat(async_client: openai.AsyncOpenAI) -> None:
    stream = await async_client.chat.completions.create(
        model=MODEL, messages=CAPITAL_IN_ONE_WORD, max_tokens=16, stream=True, **GREEDY
    )
    content = "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
    assert "Paris" in content


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
        ({"messages": [{"role": "tool", "content": "x", "tool_call_id": "1"}]}, "messages.0.role"),
    ],
)
def test_unsupported_chat_features_are_400_naming_them(
    server: ServerProcess, extra: dict[str, object], param: str
) -> None:
    body = {"model": MODEL, "messages": CAPITAL, **extra}
    response = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param
