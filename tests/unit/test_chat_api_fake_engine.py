"""/v1/chat/completions over HTTP with FakeEngine: messages, stream shape, unsupported fields."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from llmserve.engine.base import ChatMessage, StructuredOutput
from tests.fake_engine import FakeEngine
from tests.unit.conftest import MODEL
from tests.unit.test_completions_api_fake_engine import assert_openai_error, sse_payloads

USER_HI = [{"role": "user", "content": "hi"}]


def chat(client: TestClient, **fields: object):  # type: ignore[no-untyped-def]
    return client.post("/v1/chat/completions", json={"model": MODEL, **fields})


def test_chat_completion_has_openai_shape(client: TestClient) -> None:
    response = chat(client, messages=USER_HI, max_tokens=2)
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-")
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": " w0 w1", "refusal": None},
            "logprobs": None,
            "finish_reason": "length",
        }
    ]
    assert body["usage"]["completion_tokens"] == 2
    assert response.headers["x-request-id"] == body["id"]


def test_messages_reach_the_chat_template_as_text(client: TestClient, fake_engine: FakeEngine) -> None:
    chat(
        client,
        messages=[
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "three", "name": "bob"},
        ],
        max_tokens=1,
    )
    assert fake_engine.rendered[-1] == [
        ChatMessage("system", "be brief"),
        ChatMessage("user", "one\ntwo"),
        ChatMessage("assistant", "ok"),
        ChatMessage("user", "three"),
    ]


def test_stream_starts_with_role_and_ends_with_usage_and_done(client: TestClient) -> None:
    response = chat(
        client, messages=USER_HI, max_tokens=2, stream=True, stream_options={"include_usage": True}
    )
    payloads = sse_payloads(response.text)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[1:-1])
    assert content == " w0 w1"
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 2


def test_stream_with_n_sends_a_role_chunk_per_choice(client: TestClient) -> None:
    payloads = sse_payloads(chat(client, messages=USER_HI, max_tokens=1, n=2, stream=True).text)
    chunks = [json.loads(p) for p in payloads[:-1]]
    roles = [c["choices"][0]["index"] for c in chunks if c["choices"][0]["delta"].get("role")]
    assert roles == [0, 1]


def test_max_completion_tokens_wins_over_max_tokens(client: TestClient) -> None:
    body = chat(client, messages=USER_HI, max_tokens=5, max_completion_tokens=2).json()
    assert body["usage"]["completion_tokens"] == 2


def test_response_format_becomes_structured_output(client: TestClient, fake_engine: FakeEngine) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    chat(
        client,
        messages=USER_HI,
        max_tokens=1,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    )
    assert fake_engine.samplings[-1].structured_output == StructuredOutput(json_schema=schema)
    chat(client, messages=USER_HI, max_tokens=1, response_format={"type": "json_object"})
    assert fake_engine.samplings[-1].structured_output == StructuredOutput(json_object=True)
    chat(client, messages=USER_HI, max_tokens=1, response_format={"type": "text"})
    assert fake_engine.samplings[-1].structured_output is None


def test_chat_logprobs_shape(client: TestClient) -> None:
    body = chat(client, messages=USER_HI, max_tokens=2, logprobs=True, top_logprobs=2).json()
    content = body["choices"][0]["logprobs"]["content"]
    assert [entry["token"] for entry in content] == [" w0", " w1"]
    assert content[0]["bytes"] == list(b" w0")
    assert len(content[0]["top_logprobs"]) == 2


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"audio": {"voice": "x"}}, "audio"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"reasoning_effort": "high"}, "reasoning_effort"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages.0.content.0.type",
        ),
        (
            {"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}]},
            "messages.0.tool_calls",
        ),
    ],
)
def test_unsupported_chat_fields_are_400_naming_them(
    client: TestClient, fields: dict[str, object], param: str
) -> None:
    response = chat(client, **{"messages": USER_HI, **fields})
    assert_openai_error(response, 400, code="unsupported_parameter", param=param)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
        ({"messages": [{"content": "hi"}]}, "messages.0.role"),
        ({"messages": [{"role": "user", "content": None}]}, "messages.0.content"),
        ({"messages": "hi"}, "messages"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {}}},
            "response_format.json_schema.schema",
        ),
        ({"continue_final_message": True, "add_generation_prompt": True}, "continue_final_message"),
    ],
)
def test_invalid_chat_requests_are_400(client: TestClient, fields: dict[str, object], param: str) -> None:
    assert_openai_error(chat(client, **{"messages": USER_HI, **fields}), 400, param=param)


def test_continue_final_message_alone_extends_the_last_message(
    client: TestClient, fake_engine: FakeEngine
) -> None:
    messages = [*USER_HI, {"role": "assistant", "content": "Hello, I am"}]
    assert chat(client, messages=messages, max_tokens=1, continue_final_message=True).status_code == 200
    assert chat(client, messages=USER_HI, max_tokens=1).status_code == 200
    assert fake_engine.rendered[-2][-1] == ChatMessage("assistant", "Hello, I am")


def test_chat_over_the_context_window_is_400_naming_messages(client: TestClient) -> None:
    messages = [{"role": "user", "content": "word " * 100}]
    assert_openai_error(
        chat(client, messages=messages), 400, code="context_length_exceeded", param="messages"
    )


def test_unknown_model_is_404(client: TestClient) -> None:
    response = client.post("/v1/chat/completions", json={"model": "x", "messages": USER_HI})
    assert_openai_error(response, 404, code="model_not_found")
