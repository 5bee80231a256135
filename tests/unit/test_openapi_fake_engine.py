"""/openapi.json describes what the server accepts, so generated clients and fuzzers send valid data."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from llmserve.api.openapi import integers_below


def schemas(client: TestClient) -> dict[str, dict]:  # type: ignore[type-arg]
    response = client.get("/openapi.json")
    assert response.status_code == 200
    components: dict[str, dict] = response.json()["components"]["schemas"]  # type: ignore[type-arg]
    return components


def test_token_ids_are_bounded_by_the_served_vocabulary(client: TestClient) -> None:
    completion = schemas(client)["CompletionRequest"]["properties"]
    token_lists = [branch for branch in completion["prompt"]["anyOf"] if branch.get("type") == "array"]
    assert token_lists[1]["items"] == {"type": "integer", "minimum": 0, "maximum": 999}
    assert completion["stop_token_ids"]["anyOf"][0]["items"]["maximum"] == 999
    (key_pattern,) = completion["logit_bias"]["anyOf"][0]["patternProperties"]
    assert re.match(key_pattern, "999")
    assert not re.match(key_pattern, "1000")


def test_chat_messages_are_told_apart_by_role(client: TestClient) -> None:
    components = schemas(client)
    messages = components["ChatCompletionRequest"]["properties"]["messages"]["items"]
    assert messages["discriminator"]["propertyName"] == "role"
    assert set(messages["discriminator"]["mapping"]) == {"system", "developer", "user", "assistant"}
    assert "content" in components["UserMessageParam"]["required"]
    assert "content" in components["SystemMessageParam"]["required"]
    assert "content" not in components["AssistantMessageParam"].get("required", [])


@pytest.mark.parametrize("limit", [1, 2, 10, 11, 100, 101, 1000, 32000, 49152, 128256])
def test_integers_below_matches_exactly_the_numbers_under_the_limit(limit: int) -> None:
    pattern = re.compile(f"^{integers_below(limit)}$")
    assert all(bool(pattern.match(str(number))) == (number < limit) for number in range(limit * 2 + 20))
    assert not pattern.match("00")
    assert not pattern.match("01")


def test_fields_served_only_at_their_no_op_value_say_so(client: TestClient) -> None:
    completion = schemas(client)["CompletionRequest"]["properties"]
    assert completion["best_of"]["anyOf"] == [{"const": 1}, {"type": "null"}]
    assert completion["suffix"]["anyOf"] == [{"const": ""}, {"type": "null"}]
