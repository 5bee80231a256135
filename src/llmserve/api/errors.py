"""One mapping from exceptions to OpenAI error bodies and statuses, for JSON responses and SSE alike."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from llmserve.api.admission import OverloadedError
from llmserve.api.observability import observation_of
from llmserve.api.rate_limits import RateLimitedError
from llmserve.engine.base import (
    EngineDeadError,
    EngineError,
    InvalidRequestError,
    PromptTooLongError,
)
from llmserve.metrics import RequestObservation
from llmserve.protocol.chat import TAGGED_UNION_FIELDS, UNION_TAGS
from llmserve.protocol.common import ErrorInfo, ErrorResponse
from llmserve.protocol.sampling import InvalidParameterError, UnsupportedParameterError
from llmserve.runtime import DrainingError, EngineNotReadyError
from llmserve.serving.generation import PromptOverLimitError

logger = logging.getLogger(__name__)
TOO_LARGE_CODE = "request_too_large"
BODY_TIMEOUT_CODE = "body_read_timeout"


class APIError(Exception):
    """An error with everything an OpenAI client expects to read from it."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int = 400,
        error_type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.error_type = error_type
        self.code = code
        self.param = param
        self.headers = dict(headers or {})

    def to_body(self) -> ErrorResponse:
        info = ErrorInfo(message=self.message, type=self.error_type, param=self.param, code=self.code)
        return ErrorResponse(error=info)

    def to_response(self) -> Response:
        return Response(
            content=self.to_body().model_dump_json(),
            status_code=self.status_code,
            media_type="application/json",
            headers=self.headers,
        )


def model_not_found(model: str) -> APIError:
    return APIError(
        f"The model `{model}` does not exist.",
        status_code=404,
        code="model_not_found",
        param="model",
    )


def service_unavailable(message: str, code: str, retry_after_s: int | None = None) -> APIError:
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else None
    return APIError(message, status_code=503, error_type="service_unavailable", code=code, headers=headers)


def to_api_error(exc: BaseException) -> APIError:
    """Classify any exception raised while serving a request."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, PromptTooLongError):
        return APIError(str(exc), code="context_length_exceeded", param=exc.param)
    if isinstance(exc, UnsupportedParameterError):
        return APIError(str(exc), code="unsupported_parameter", param=exc.param)
    if isinstance(exc, InvalidParameterError):
        return APIError(str(exc), code="invalid_value", param=exc.param)
    if isinstance(exc, PromptOverLimitError):
        return APIError(str(exc), code="prompt_too_long", param=exc.param)
    if isinstance(exc, InvalidRequestError):
        return APIError(str(exc), code="invalid_value", param=exc.param)
    if isinstance(exc, RateLimitedError):
        return APIError(
            str(exc),
            status_code=429,
            error_type=exc.kind,
            code="rate_limit_exceeded",
            headers={"Retry-After": str(exc.retry_after_s), **exc.headers},
        )
    if isinstance(exc, OverloadedError):
        return APIError(
            str(exc),
            status_code=429,
            error_type="rate_limit_error",
            code="overloaded",
            headers={"Retry-After": str(exc.retry_after_s)},
        )
    if isinstance(exc, DrainingError):
        return service_unavailable("The server is shutting down; retry on another instance.", "draining", 1)
    if isinstance(exc, EngineNotReadyError):
        return service_unavailable("The inference engine is not ready yet.", "engine_not_ready", 5)
    if isinstance(exc, EngineDeadError):
        return service_unavailable("The inference engine is not running.", "engine_dead")
    if isinstance(exc, EngineError):
        return APIError(
            "The inference engine failed while generating.",
            status_code=500,
            error_type="server_error",
            code="engine_error",
        )
    logger.error("unhandled error while serving a request", exc_info=exc)
    return APIError(
        "The server had an error while processing your request.",
        status_code=500,
        error_type="server_error",
        code="internal_error",
    )


# Fields whose value is a mapping with client-chosen keys.
MAPPING_FIELDS = frozenset({"logit_bias"})


# pydantic errors that mean "a kind this server does not implement": a message role or content-part
# type outside the discriminated unions of protocol/chat.py (tool messages, image parts).
UNSUPPORTED_KIND_ERRORS = frozenset({"union_tag_invalid"})
KIND_ERRORS = UNSUPPORTED_KIND_ERRORS | {"union_tag_not_found"}


def describe_validation_errors(errors: list[Any]) -> APIError:
    """A readable 400 naming the offending parameter, from pydantic's error list."""
    if not errors or errors[0].get("type") == "json_invalid":
        return APIError("The request body is not valid JSON.", code="invalid_json")
    chosen = _most_specific(errors)
    location = [part for part in chosen.get("loc", ()) if part != "body"]
    if location and location[0] in MAPPING_FIELDS:
        location = location[:1]  # the rest is the client's own keys
    if chosen.get("type") in KIND_ERRORS:
        location.append(str(chosen.get("ctx", {}).get("discriminator", "")).strip("'"))
    param = ".".join(str(part) for part in _field_path(location)) or None
    message = str(chosen.get("msg", "invalid request"))
    if param:
        message = f"Invalid value for '{param}': {message}"
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    if chosen.get("type") in UNSUPPORTED_KIND_ERRORS:
        return APIError(message, code="unsupported_parameter", param=param)
    return APIError(message, code="invalid_value" if param else "invalid_json", param=param)


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


# Errors that are refusals for load, policy or time are also counted as rejections, by reason.
REJECTION_REASON_OF_CODE = {
    TOO_LARGE_CODE: "too_large",
    BODY_TIMEOUT_CODE: "timeout",
    "draining": "draining",
    "overloaded": "overloaded",
    "rate_limit_exceeded": "rate_limited",
    "request_timeout": "timeout",
}


def record_error(observation: RequestObservation | None, error: APIError) -> None:
    """The one place an error sent to a client (as JSON or inside a stream) is counted."""
    if observation is None:
        return
    observation.on_error(error.code)
    if (reason := REJECTION_REASON_OF_CODE.get(error.code or "")) is not None:
        observation.on_rejected(reason)


def _answer(request: Request, error: APIError) -> Response:
    record_error(observation_of(request), error)
    return error.to_response()


async def _api_error_handler(request: Request, exc: Exception) -> Response:
    return _answer(request, to_api_error(exc))


async def _validation_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    return _answer(request, describe_validation_errors(list(exc.errors())))


async def _http_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    error_type = "invalid_request_error" if exc.status_code < 500 else "server_error"
    code = {404: "not_found", 405: "method_not_allowed", 408: BODY_TIMEOUT_CODE, 413: TOO_LARGE_CODE}.get(
        exc.status_code
    )
    error = APIError(
        str(exc.detail), status_code=exc.status_code, error_type=error_type, code=code, headers=exc.headers
    )
    return _answer(request, error)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation_error_handler)
    app.add_exception_handler(StarletteHTTPException, _http_error_handler)
    for expected in (APIError, EngineError, ValueError, OverloadedError, RateLimitedError):
        app.add_exception_handler(expected, _api_error_handler)
    # Anything else is a bug: a generic 500 body, never the exception text.
    app.add_exception_handler(Exception, _api_error_handler)
