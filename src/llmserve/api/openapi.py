"""The served /openapi.json, made to describe what the server really answers.

`model` is declared as the one served model name, and token ids (prompt tokens, stop_token_ids,
logit_bias keys) as below the model's vocabulary size once the engine has told it. FastAPI
documents request-validation
failures as 422 `HTTPValidationError`; this server answers them with 400 and an OpenAI error
body (see api/errors.py), so those entries are replaced. Every other response a route can
give is declared on the route itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from llmserve.protocol.common import ErrorResponse
from llmserve.protocol.sampling import TOKEN_ID_KEY_PATTERN, TOKEN_ID_MARK

ERROR_SCHEMA_REF = {"$ref": "#/components/schemas/ErrorResponse"}
FASTAPI_VALIDATION_SCHEMAS = ("HTTPValidationError", "ValidationError")
GENERATION_REQUEST_SCHEMAS = ("CompletionRequest", "ChatCompletionRequest")


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` entries for a route: each status with the OpenAI error body."""
    return {status: {"model": ErrorResponse} for status in statuses}


GENERATION_ERROR_RESPONSES = error_responses(400, 401, 404, 408, 413, 415, 429, 500, 503, 504)


def accurate_openapi(
    app: FastAPI, served_model_name: str, vocab_size: Callable[[], int | None]
) -> dict[str, Any]:
    if app.openapi_schema is not None:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
    for path_item in schema.get("paths", {}).values():
        for operation in path_item.values():
            responses = operation.get("responses", {})
            if responses.pop("422", None) is not None:
                responses.setdefault(
                    "400",
                    {
                        "description": "Invalid request",
                        "content": {"application/json": {"schema": ERROR_SCHEMA_REF}},
                    },
                )
    schemas = schema.get("components", {}).get("schemas", {})
    for name in FASTAPI_VALIDATION_SCHEMAS:
        schemas.pop(name, None)
    # The one model this server serves; any other name is a 404 model_not_found.
    for name in GENERATION_REQUEST_SCHEMAS:
        if name in schemas:
            schemas[name]["properties"]["model"] = {
                "type": "string",
                "enum": [served_model_name],
                "title": "Model",
            }
    vocabulary = vocab_size()
    if vocabulary is None:
        return schema  # the engine is still starting: answer, but build it again next time
    _bound_token_ids(schema, vocabulary)
    app.openapi_schema = schema
    return schema


def _bound_token_ids(node: Any, vocab_size: int) -> None:
    if isinstance(node, dict):
        if node.pop(TOKEN_ID_MARK, False):
            node["maximum"] = vocab_size - 1
        patterns = node.get("patternProperties")
        if isinstance(patterns, dict) and TOKEN_ID_KEY_PATTERN in patterns:
            patterns[f"^{integers_below(vocab_size)}$"] = patterns.pop(TOKEN_ID_KEY_PATTERN)
        for child in node.values():
            _bound_token_ids(child, vocab_size)
    elif isinstance(node, list):
        for child in node:
            _bound_token_ids(child, vocab_size)


def integers_below(limit: int) -> str:
    """A regular expression for the decimal numbers 0 .. limit - 1, without leading zeros."""
    top = str(limit - 1)
    if len(top) == 1:
        return f"[0-{top}]"
    shorter = ["[0-9]", *(f"[1-9][0-9]{{{length - 1}}}" for length in range(2, len(top)))]
    return "(?:" + "|".join([*shorter, *_as_long_up_to(top)]) + ")"


def _as_long_up_to(top: str) -> list[str]:
    """The numbers with as many digits as `top` and not above it: a prefix of `top`, one smaller
    digit, then any digits."""
    alternatives = []
    for position, digit in enumerate(top):
        lowest = 1 if position == 0 else 0
        if int(digit) > lowest:
            smaller = str(lowest) if int(digit) - 1 == lowest else f"[{lowest}-{int(digit) - 1}]"
            rest = len(top) - position - 1
            alternatives.append(top[:position] + smaller + (f"[0-9]{{{rest}}}" if rest else ""))
    return [*alternatives, top]


def install_openapi(app: FastAPI, served_model_name: str, vocab_size: Callable[[], int | None]) -> None:
    app.openapi = lambda: accurate_openapi(app, served_model_name, vocab_size)  # type: ignore[method-assign]
