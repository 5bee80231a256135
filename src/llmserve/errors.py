"""Every error the server sends, each knowing its own HTTP status and OpenAI type, code and param.

Framework-free, so policy/ and engine/ raise them too. Rendering one is `to_body()` (the OpenAI
error object), sent as a JSON response (api/errors.py) or as an SSE event once a stream has begun
(serving/streaming.py). Any other exception is a bug: `as_serving_error` turns it into a generic
500 and logs it, never echoing its text to the client.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from llmserve.protocol.common import ErrorInfo, ErrorResponse

logger = logging.getLogger(__name__)


class ServingError(Exception):
    status_code: int = 400
    error_type: str = "invalid_request_error"
    code: str | None = None
    # Refusals for load, policy or time are also counted as rejections, by this reason.
    rejection: str | None = None

    def __init__(
        self, message: str, *, param: str | None = None, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.headers = dict(headers or {})

    @property
    def type(self) -> str:
        return self.error_type

    def to_body(self) -> ErrorResponse:
        info = ErrorInfo(message=self.message, type=self.type, param=self.param, code=self.code)
        return ErrorResponse(error=info)


def retry_after(seconds: int) -> dict[str, str]:
    return {"Retry-After": str(seconds)}


# 400: the request itself


class InvalidParameterError(ServingError):
    code = "invalid_value"

    def __init__(self, param: str | None, reason: str) -> None:
        message = f"Invalid value for '{param}': {reason}" if param else reason
        super().__init__(message, param=param)


class UnsupportedParameterError(ServingError):
    code = "unsupported_parameter"

    def __init__(self, param: str, reason: str) -> None:
        super().__init__(f"'{param}' {reason}", param=param)


class InvalidJsonError(ServingError):
    code = "invalid_json"

    def __init__(self, message: str = "The request body is not valid JSON.") -> None:
        super().__init__(message)


class PromptTooLongError(ServingError):
    """Prompt + completion budget over the model's context window."""

    code = "context_length_exceeded"

    def __init__(self, prompt_tokens: int, max_tokens: int, max_model_len: int, param: str) -> None:
        super().__init__(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, "
            f"{max_tokens} for the completion). Please reduce the prompt or max_tokens.",
            param=param,
        )


class PromptOverLimitError(ServingError):
    """A prompt longer than `admission.max_prompt_tokens`."""

    code = "prompt_too_long"

    def __init__(self, prompt_len: int, limit: int, param: str) -> None:
        super().__init__(
            f"The prompt has {prompt_len} tokens; this server accepts at most {limit}.", param=param
        )


class EngineRefusedError(InvalidParameterError):
    """The engine refused the request's parameters; its message is safe to show."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(param, message)


class UnauthorizedError(ServingError):
    status_code = 401
    code = "invalid_api_key"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"WWW-Authenticate": "Bearer"})


class ModelNotFoundError(ServingError):
    status_code = 404
    code = "model_not_found"

    def __init__(self, model: str) -> None:
        super().__init__(f"The model `{model}` does not exist.", param="model")


class RouteError(ServingError):
    """Starlette's own refusals: no such path (404), not that method (405)."""

    def __init__(self, status_code: int, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message, headers=headers)
        self.status_code = status_code
        self.code = {404: "not_found", 405: "method_not_allowed"}.get(status_code)
        self.error_type = "invalid_request_error" if status_code < 500 else "server_error"


class UnsupportedMediaTypeError(ServingError):
    status_code = 415
    code = "unsupported_media_type"


class BodyReadTimeoutError(ServingError):
    status_code = 408
    code = "body_read_timeout"
    rejection = "timeout"


class BodyTooLargeError(ServingError):
    status_code = 413
    code = "request_too_large"
    rejection = "too_large"


# 429: load and policy


class RateLimitedError(ServingError):
    """Over the key's requests or tokens per minute; `type` names which, as OpenAI does."""

    status_code = 429
    code = "rate_limit_exceeded"
    rejection = "rate_limited"

    def __init__(self, message: str, kind: str, retry_after_s: int, headers: Mapping[str, str]) -> None:
        super().__init__(message, headers={**retry_after(retry_after_s), **headers})
        self.kind = kind

    @property
    def type(self) -> str:
        return self.kind


class OverloadedError(ServingError):
    status_code = 429
    error_type = "rate_limit_error"
    code = "overloaded"
    rejection = "overloaded"

    def __init__(self, message: str, retry_after_s: int, after_waiting: bool = False) -> None:
        super().__init__(message, headers=retry_after(retry_after_s))
        self.retry_after_s = retry_after_s
        if after_waiting:  # a slow refusal: the metric tells them apart
            self.rejection = "overloaded_after_waiting"


class FrontEndOverloadedError(OverloadedError):
    """429 because the API process itself runs behind (its event loop), not the engine: counted
    apart, since the remedy differs (more API processes, not a larger engine)."""

    rejection = "front_end_overloaded"

    def __init__(self, lag_s: float) -> None:
        super().__init__(f"The server is overloaded: its front end runs {lag_s * 1000:.0f} ms behind.", 1)


# 5xx: the server and its engine


class InternalError(ServingError):
    status_code = 500
    error_type = "server_error"
    code = "internal_error"

    def __init__(self) -> None:
        super().__init__("The server had an error while processing your request.")


class EngineFailedError(ServingError):
    """The engine failed while generating; `detail` (and the cause) go to the log, not the client."""

    status_code = 500
    error_type = "server_error"
    code = "engine_error"

    def __init__(self, detail: str) -> None:
        super().__init__("The inference engine failed while generating.")
        self.detail = detail


class EngineDeadError(ServingError):
    status_code = 503
    error_type = "service_unavailable"
    code = "engine_dead"

    def __init__(self) -> None:
        super().__init__("The inference engine is not running.")


class EngineNotReadyError(ServingError):
    status_code = 503
    error_type = "service_unavailable"
    code = "engine_not_ready"

    def __init__(self) -> None:
        super().__init__("The inference engine is not ready yet.", headers=retry_after(5))


class DrainingError(ServingError):
    status_code = 503
    error_type = "service_unavailable"
    code = "draining"
    rejection = "draining"

    def __init__(self, message: str = "The server is shutting down; retry on another instance.") -> None:
        super().__init__(message, headers=retry_after(1))


class RequestTimeoutError(ServingError):
    status_code = 504
    error_type = "timeout_error"
    code = "request_timeout"
    rejection = "timeout"

    def __init__(self) -> None:
        super().__init__("The request did not finish within its timeout.")


def as_serving_error(exc: BaseException) -> ServingError:
    """The error to send for any exception raised while serving; a bug becomes a logged 500."""
    if isinstance(exc, EngineFailedError):
        logger.error("inference engine: %s", exc.detail, exc_info=exc.__cause__)
    if isinstance(exc, ServingError):
        return exc
    logger.error("unhandled error while serving a request", exc_info=exc)
    return InternalError()
