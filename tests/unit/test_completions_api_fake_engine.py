"""/v1/completions over HTTP with FakeEngine: wire shapes, SSE framing and OpenAI error bodies."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from tests.fake_engine import FAIL_MID_STREAM, FakeEngine
from tests.unit.conftest import MODEL


def complete(client: TestClient, **fields: object):  # type: ignore[no-untyped-def]
    return client.post("/v1/completions", json={"model": MODEL, **fields})


def sse_payloads(text: str) -> list[str]:
    events = [block for block in text.split("\n\n") if block]
    assert all(event.startswith("data: ") for event in events), events
    return [event.removeprefix("data: ") for event in events]


def assert_openai_error(response, status: int, code: str | None = None, param: str | None = None):  # type: ignore[no-untyped-def]
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    if code is not None:
        assert error["code"] == code
    if param is not None:
        assert error["param"] == param
    return error


def test_completion_has_openai_shape(client: TestClient) -> None:
    response = complete(client, prompt="one two three", max_tokens=3)
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "text_completion"
    assert body["id"].startswith("cmpl-")
    assert body["model"] == MODEL
    assert isinstance(body["created"], int)
    assert body["choices"] == [{"index": 0, "text": " w0 w1 w2", "logprobs": None, "finish_reason": "length"}]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}


def test_list_of_prompts_gives_one_choice_per_prompt_in_order(client: TestClient) -> None:
    response = complete(client, prompt=["a", "b c", "d e f"], max_tokens=2)
    choices = response.json()["choices"]
    assert [choice["index"] for choice in choices] == [0, 1, 2]
    assert response.json()["usage"]["prompt_tokens"] == 6


def test_token_id_prompts_are_accepted(client: TestClient) -> None:
    single = complete(client, prompt=[5, 6, 7], max_tokens=1)
    batch = complete(client, prompt=[[5, 6], [7]], max_tokens=1)
    assert single.json()["usage"]["prompt_tokens"] == 3
    assert len(batch.json()["choices"]) == 2


def test_stop_string_ends_generation(client: TestClient) -> None:
    body = complete(client, prompt="x", max_tokens=10, stop=["w2"]).json()
    assert body["choices"][0]["text"] == " w0 w1"
    assert body["choices"][0]["finish_reason"] == "stop"


def test_stream_sends_chunks_then_usage_then_done(client: TestClient) -> None:
    response = complete(
        client, prompt="a b", max_tokens=3, stream=True, stream_options={"include_usage": True}
    )
    assert response.headers["content-type"].startswith("text/event-stream")
    payloads = sse_payloads(response.text)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    text_chunks, usage_chunk = chunks[:-1], chunks[-1]
    assert "".join(c["choices"][0]["text"] for c in text_chunks) == " w0 w1 w2"
    assert [c["choices"][0]["finish_reason"] for c in text_chunks] == [None, None, "length"]
    assert all(c["usage"] is None for c in text_chunks)
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
    assert len({c["id"] for c in chunks}) == 1


def test_stream_without_include_usage_has_no_usage_chunk(client: TestClient) -> None:
    payloads = sse_payloads(complete(client, prompt="a", max_tokens=2, stream=True).text)
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert all(chunk["choices"] for chunk in chunks)


def test_stream_of_several_prompts_labels_choices_by_index(client: TestClient) -> None:
    payloads = sse_payloads(complete(client, prompt=["a", "b"], max_tokens=2, stream=True).text)
    chunks = [json.loads(p) for p in payloads[:-1]]
    by_index: dict[int, str] = {}
    for chunk in chunks:
        choice = chunk["choices"][0]
        by_index[choice["index"]] = by_index.get(choice["index"], "") + choice["text"]
    assert by_index == {0: " w0 w1", 1: " w0 w1"}


def test_engine_failure_mid_stream_becomes_an_sse_error_event(client: TestClient) -> None:
    response = complete(client, prompt=f"x {FAIL_MID_STREAM}", max_tokens=5, stream=True)
    assert response.status_code == 200
    payloads = sse_payloads(response.text)
    assert payloads[-1] == "[DONE]"
    error = json.loads(payloads[-2])["error"]
    assert error["type"] == "server_error"
    assert "fake failure" not in error["message"]


def test_engine_failure_without_stream_is_a_500_without_internals(client: TestClient) -> None:
    error = assert_openai_error(complete(client, prompt=FAIL_MID_STREAM, max_tokens=5), 500)
    assert "fake failure" not in error["message"]


def test_request_id_header_is_echoed_or_generated(client: TestClient) -> None:
    echoed = client.post(
        "/v1/completions",
        json={"model": MODEL, "prompt": "a", "max_tokens": 1},
        headers={"x-request-id": "trace-123"},
    )
    assert echoed.headers["x-request-id"] == "trace-123"
    generated = complete(client, prompt="a", max_tokens=1)
    assert generated.headers["x-request-id"] == generated.json()["id"]


def test_omitted_max_tokens_is_16_as_in_openai_and_vllm(client: TestClient) -> None:
    body = complete(client, prompt="a b c d").json()
    assert body["usage"]["completion_tokens"] == 16


def test_null_max_tokens_fills_the_context_window(client: TestClient, fake_engine: FakeEngine) -> None:
    body = complete(client, prompt="a b c d", max_tokens=None).json()
    assert body["usage"]["completion_tokens"] == fake_engine.model_info.max_model_len - 4


def test_unknown_fields_are_accepted(client: TestClient) -> None:
    assert complete(client, prompt="a", max_tokens=1, some_future_field=True).status_code == 200


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"temperature": 2.5}, "temperature"),
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -1, "echo": True}, "max_tokens"),
        ({"max_tokens": "ten"}, "max_tokens"),
        ({"stream": "yes please"}, "stream"),
        ({"stop": ["x"] * 17}, "stop"),
        ({"stop": [""]}, "stop"),
        ({"prompt": {"text": "a"}}, "prompt"),
        ({"prompt": [-1, 2]}, "prompt"),
        ({"seed": 2**70}, "seed"),
        ({"n": 0}, "n"),
        ({"n": 17}, "n"),
        ({"logprobs": 21}, "logprobs"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"min_p": 1.5}, "min_p"),
        ({"top_k": -2}, "top_k"),
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"logit_bias": {"5000": 1}}, "logit_bias"),
        ({"stop_token_ids": [5000]}, "stop_token_ids"),
        ({"stop_token_ids": [-1]}, "stop_token_ids.0"),
        ({"temperature": "NaN"}, "temperature"),
        ({"top_p": "Infinity"}, "top_p"),
    ],
)
def test_invalid_parameters_are_400_naming_the_parameter(
    client: TestClient, fields: dict[str, object], param: str
) -> None:
    assert_openai_error(complete(client, **{"prompt": "a", **fields}), 400, param=param)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"best_of": 3}, "best_of"),
        ({"suffix": "end"}, "suffix"),
    ],
)
def test_unsupported_parameters_are_400_naming_the_parameter(
    client: TestClient, fields: dict[str, object], param: str
) -> None:
    assert_openai_error(
        complete(client, prompt="a", **fields), 400, code="unsupported_parameter", param=param
    )


@pytest.mark.parametrize("prompt", ["", "   ", [], [[]]])
def test_empty_prompts_are_400(client: TestClient, prompt: object) -> None:
    assert_openai_error(complete(client, prompt=prompt, max_tokens=1), 400)


def test_token_ids_beyond_the_vocabulary_are_400(client: TestClient) -> None:
    assert_openai_error(complete(client, prompt=[1, 10**6], max_tokens=1), 400, param="prompt")


def test_prompt_plus_max_tokens_beyond_context_is_400_with_numbers(client: TestClient) -> None:
    error = assert_openai_error(
        complete(client, prompt="a b c", max_tokens=62), 400, code="context_length_exceeded"
    )
    assert "64" in error["message"]
    assert "65" in error["message"]
    assert "3 in the prompt" in error["message"]


def test_prompt_filling_the_whole_context_is_400(client: TestClient) -> None:
    assert_openai_error(complete(client, prompt="a " * 64), 400, code="context_length_exceeded")


def test_unknown_model_is_404(client: TestClient) -> None:
    response = client.post("/v1/completions", json={"model": "gpt-9", "prompt": "a"})
    assert_openai_error(response, 404, code="model_not_found", param="model")


def test_missing_model_field_is_400(client: TestClient) -> None:
    assert_openai_error(client.post("/v1/completions", json={"prompt": "a"}), 400, param="model")


@pytest.mark.parametrize(
    ("content", "content_type"),
    [
        (b'{"model": "x", "prompt": ', "application/json"),
        (b"\xff\xfe not utf8", "application/json"),
        (b"[1, 2, 3]", "application/json"),
        (b"", "application/json"),
        (b'{"model": "x", "prompt": "a\\ud800b"}', "application/json"),
        (b'{"model": "x", "prompt": "hi", "temperature": NaN}', "application/json"),
        (b'{"model": "x", "prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}", "application/json"),
    ],
)
def test_malformed_bodies_are_400(client: TestClient, content: bytes, content_type: str) -> None:
    response = client.post("/v1/completions", content=content, headers={"content-type": content_type})
    assert_openai_error(response, 400)


def test_a_body_declared_as_another_media_type_is_415_and_a_missing_type_means_json(
    client: TestClient,
) -> None:
    body = b'{"model": "%s", "prompt": "hi", "max_tokens": 2}' % MODEL.encode()
    form = client.post("/v1/completions", content=b"model=x", headers={"content-type": "text/plain"})
    assert_openai_error(form, 415)
    assert form.json()["error"]["code"] == "unsupported_media_type"
    assert client.post("/v1/completions", content=body).status_code == 200


def test_unknown_route_and_wrong_method_speak_openai_errors(client: TestClient) -> None:
    assert_openai_error(client.get("/v1/nothing-here"), 404)
    assert_openai_error(client.get("/v1/completions"), 405)


def test_models_lists_the_served_model(client: TestClient) -> None:
    body = client.get("/v1/models").json()
    assert body["object"] == "list"
    assert [model["id"] for model in body["data"]] == [MODEL]
    assert body["data"][0]["object"] == "model"


def test_every_sampling_field_reaches_the_engine(client: TestClient, fake_engine: FakeEngine) -> None:
    complete(
        client,
        prompt="a",
        max_tokens=2,
        n=2,
        temperature=0.7,
        top_p=0.9,
        top_k=5,
        min_p=0.1,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        repetition_penalty=1.2,
        seed=7,
        stop=["x", "y"],
        stop_token_ids=[3],
        ignore_eos=True,
        logprobs=2,
        logit_bias={"10": -100},
    )
    spec = fake_engine.samplings[-1]
    assert (spec.n, spec.temperature, spec.top_p, spec.top_k, spec.min_p) == (2, 0.7, 0.9, 5, 0.1)
    assert (spec.presence_penalty, spec.frequency_penalty, spec.repetition_penalty) == (0.5, -0.5, 1.2)
    assert (spec.seed, spec.stop, spec.stop_token_ids, spec.ignore_eos) == (7, ("x", "y"), (3,), True)
    assert (spec.logprobs, spec.logit_bias, spec.prompt_logprobs) == (2, {10: -100.0}, None)


def test_omitted_sampling_fields_take_openai_defaults(client: TestClient, fake_engine: FakeEngine) -> None:
    complete(client, prompt="a", max_tokens=1)
    spec = fake_engine.samplings[-1]
    assert (spec.n, spec.temperature, spec.top_p, spec.top_k) == (1, 1.0, 1.0, 0)
    assert (spec.presence_penalty, spec.frequency_penalty, spec.repetition_penalty) == (0.0, 0.0, 1.0)
    assert spec.logprobs is None
    assert spec.structured_output is None


def test_n_choices_are_numbered_across_prompts(client: TestClient) -> None:
    body = complete(client, prompt=["a", "b"], max_tokens=1, n=3).json()
    assert [choice["index"] for choice in body["choices"]] == [0, 1, 2, 3, 4, 5]
    assert body["usage"]["completion_tokens"] == 6


def test_n_choices_stream_with_their_index(client: TestClient) -> None:
    payloads = sse_payloads(complete(client, prompt="a", max_tokens=2, n=2, stream=True).text)
    indices = {json.loads(p)["choices"][0]["index"] for p in payloads[:-1]}
    assert indices == {0, 1}


def test_echo_prepends_the_prompt(client: TestClient) -> None:
    body = complete(client, prompt="hello there", max_tokens=2, echo=True).json()
    assert body["choices"][0]["text"] == "hello there w0 w1"
    streamed = sse_payloads(complete(client, prompt="hi", max_tokens=1, echo=True, stream=True).text)
    assert json.loads(streamed[0])["choices"][0]["text"] == "hi w0"


def test_echo_with_max_tokens_0_returns_the_prompt_and_its_logprobs_only(client: TestClient) -> None:
    body = complete(client, prompt="a bb ccc", max_tokens=0, echo=True, logprobs=1).json()
    choice = body["choices"][0]
    assert choice["text"] == "a bb ccc"
    assert choice["logprobs"]["tokens"] == ["t1", " t2", " t3"]
    assert choice["logprobs"]["token_logprobs"] == [None, -1.0, -1.0]
    assert choice["logprobs"]["top_logprobs"][0] is None
    assert choice["logprobs"]["top_logprobs"][1] == {" t2": -1.0, " zz": -0.1}
    assert choice["finish_reason"] == "length"
    # As vLLM: the engine runs one step for the prompt's logprobs, and usage counts its token.
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    streamed = sse_payloads(
        complete(client, prompt="a bb", max_tokens=0, echo=True, logprobs=0, stream=True).text
    )
    chunks = [json.loads(payload)["choices"][0] for payload in streamed[:-1]]
    assert "".join(chunk["text"] for chunk in chunks) == "a bb"
    assert chunks[0]["logprobs"]["token_logprobs"] == [None, -1.0]


def test_logprobs_0_still_lists_the_sampled_token_as_openai_does(client: TestClient) -> None:
    logprobs = complete(client, prompt="a", max_tokens=2, logprobs=0).json()["choices"][0]["logprobs"]
    assert logprobs["top_logprobs"] == [{" w0": -0.5}, {" w1": -0.5}]


def test_logprobs_have_one_entry_per_token_with_top_alternatives(client: TestClient) -> None:
    logprobs = complete(client, prompt="a", max_tokens=3, logprobs=2).json()["choices"][0]["logprobs"]
    assert logprobs["tokens"] == [" w0", " w1", " w2"]
    assert logprobs["token_logprobs"] == [-0.5, -0.5, -0.5]
    assert all(len(top) == 2 for top in logprobs["top_logprobs"])
    assert logprobs["text_offset"] == [0, 3, 6]


def test_streamed_logprobs_continue_the_text_offsets(client: TestClient) -> None:
    payloads = sse_payloads(complete(client, prompt="a", max_tokens=3, logprobs=1, stream=True).text)
    offsets = [json.loads(p)["choices"][0]["logprobs"]["text_offset"] for p in payloads[:-1]]
    assert offsets == [[0], [3], [6]]


def test_prompts_over_the_configured_limit_are_400_prompt_too_long() -> None:
    from llmserve.config import parse_overrides
    from tests.unit.conftest import make_client

    with make_client(parse_overrides(["admission.max_prompt_tokens=3"])) as client:
        error = assert_openai_error(
            complete(client, prompt="a b c d", max_tokens=1), 400, code="prompt_too_long", param="prompt"
        )
        assert "4 tokens" in error["message"]
        assert "at most 3" in error["message"]
        messages = [{"role": "user", "content": "a b c d"}]
        response = client.post("/v1/chat/completions", json={"model": MODEL, "messages": messages})
        assert_openai_error(response, 400, code="prompt_too_long", param="messages")
        assert complete(client, prompt="a b c", max_tokens=1).status_code == 200
