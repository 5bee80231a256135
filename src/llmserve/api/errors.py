"""Errors as HTTP answers: every ServingError renders itself; validation and routing errors become one.

The error types, with their statuses, are in llmserve/errors.py. Here: the JSON response, the
handlers FastAPI calls, and pydantic's validation errors described as an OpenAI 400.
"""

from __future__ import annotations

import itertools
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from llmserve.api.observability import observation_of
from llmserve.errors import (
    InvalidJsonError,
    InvalidParameterError,
    RouteError,
    ServingError,
    UnsupportedParameterError,
    as_serving_error,
)
from llmserve.protocol.chat import TAGGED_UNION_FIELDS, UNION_TAGS


def error_response(error: ServingError) -> Response:
    return Response(
        content=error.to_body().model_dump_json(),
        status_code=error.status_code,
        media_type="application/json",
        headers=error.headers,
    )


def answer(request: Request, error: ServingError) -> Response:
    """The one place an error sent as JSON is counted."""
    if (observation := observation_of(request)) is not None:
        observation.on_error(error)
    return error_response(error)


async def _serving_error_handler(request: Request, exc: Exception) -> Response:
    return answer(request, as_serving_error(exc))


async def _validation_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    return answer(request, describe_validation_errors(list(exc.errors())))


async def _http_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    error = getattr(exc, "error", None)  # a body refused while it streamed in (api/body_limit.py)
    if not isinstance(error, ServingError):
        error = RouteError(exc.status_code, str(exc.detail), exc.headers)
    return answer(request, error)


# Fields whose value is a mapping with client-chosen keys.
MAPPING_FIELDS = frozenset({"logit_bias"})


# pydantic errors that mean "a kind this server does not implement": a message role or content-part
# type outside the discriminated unions of protocol/chat.py (tool messages, image parts).
UNSUPPORTED_KIND_ERRORS = frozenset({"union_tag_invalid"})
KIND_ERRORS = UNSUPPORTED_KIND_ERRORS | {"union_tag_not_found"}


def describe_validation_errors(errors: list[Any]) -> ServingError:
    """A readable 400 naming the offending parameter, from pydantic's error list."""
    if not errors or errors[0].get("type") == "json_invalid":
        return InvalidJsonError()
    chosen = _most_specific(errors)
    location = [part for part in chosen.get("loc", ()) if part != "body"]
    if location and location[0] in MAPPING_FIELDS:
        location = location[:1]  # the rest is the client's own keys
    if chosen.get("type") in KIND_ERRORS:
        location.append(str(chosen.get("ctx", {}).get("discriminator", "")).strip("'"))
    param = ".".join(str(part) for part in _field_path(location)) or None
    message = str(chosen.get("msg", "invalid request"))
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    if param is None:
        return InvalidJsonError(message)
    if chosen.get("type") in UNSUPPORTED_KIND_ERRORS:
        return UnsupportedParameterError(param, f"is not supported: {message}")
    return InvalidParameterError(param, message)


def _most_specific(errors: list[Any]) -> Any:
    """A wrong kind (role, part type) explains more than the union branches it failed; an error
    inside a tagged union member (a content part) more than the branch that wanted a string."""
    kind = next((error for error in errors if error.get("type") in KIND_ERRORS), None)
    inside = next((error for error in errors if _inside_a_tagged_union_member(error.get("loc", ()))), None)
    return kind or inside or errors[0]


def _inside_a_tagged_union_member(location: tuple[Any, ...]) -> bool:
    pairs = itertools.pairwise(location)
    return any(str(part).startswith("list[tagged-union[") and isinstance(nxt, int) for part, nxt in pairs)


def _field_path(location: list[Any]) -> list[Any]:
    """The request's own path: pydantic adds the type of each union branch (`str`, `list[...]`)
    and the tag of a discriminated-union member (`user`, `text`, `json_schema`)."""
    path: list[Any] = []
    previous: Any = None
    for part in location:
        may_be_tag = isinstance(previous, int) or previous in TAGGED_UNION_FIELDS
        previous = part
        if isinstance(part, str) and (_is_type_tag(part) or (may_be_tag and part in UNION_TAGS)):
            continue
        path.append(part)
    return path


def _is_type_tag(part: str) -> bool:
    tags = ("list[", "dict[", "function-", "constrained-")
    return part in {"str", "int", "float", "bool"} or part.startswith(tags)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation_error_handler)
    app.add_exception_handler(StarletteHTTPException, _http_error_handler)
    app.add_exception_handler(ServingError, _serving_error_handler)  # each answers as itself
    # Anything else is a bug: a generic 500 body, logged, never the exception's text.
    app.add_exception_handler(Exception, _serving_error_handler)
