"""The served /openapi.json, made to describe what the server really answers.

`model` is declared as the one served model name. FastAPI documents request-validation
failures as 422 `HTTPValidationError`; this server answers them with 400 and an OpenAI error
body (see api/errors.py), so those entries are replaced. Every other response a route can
give is declared on the route itself.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from llmserve.protocol.common import ErrorResponse

ERROR_SCHEMA_REF = {"$ref": "#/components/schemas/ErrorResponse"}
FASTAPI_VALIDATION_SCHEMAS = ("HTTPValidationError", "ValidationError")
GENERATION_REQUEST_SCHEMAS = ("CompletionRequest", "ChatCompletionRequest")


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` entries for a route: each status with the OpenAI error body."""
    return {status: {"model": ErrorResponse} for status in statuses}


def accurate_openapi(app: FastAPI, served_model_name: str) -> dict[str, Any]:
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
    app.openapi_schema = schema
    return schema


def install_openapi(app: FastAPI, served_model_name: str) -> None:
    app.openapi = lambda: accurate_openapi(app, served_model_name)  # type: ignore[method-assign]
