"""Wire types shared by the OpenAI endpoints."""

from __future__ import annotations

import time
from typing import Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

# Past 2^53 a float no longer holds every integer: orjson reads an integer literal beyond 64 bits as
# the nearest float, so -9223372036854776001 would become -2^63 and pass a bound it breaks.
_EXACT_FLOAT_INTEGERS = 2**53


def integral_float_as_int(value: object) -> object:
    """5.0 as 5; anything else (5.5, a float past 2^53, "5", true) as it came."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= _EXACT_FLOAT_INTEGERS:
        return int(value)
    return value


# Request integers as JSON Schema defines them: 5.0 is the integer 5 (strict pydantic alone would
# refuse it), while 5.5, "5" and true are not integers. Use as `Annotated[int, Field(...), INTEGRAL]`:
# constraints placed before the validator are the ones /openapi.json shows as minimum/maximum.
INTEGRAL = BeforeValidator(integral_float_as_int)


class OpenAIBaseModel(BaseModel):
    """Requests accept unknown fields (OpenAI clients send new ones all the time); they are logged.

    Strict: a value must have the JSON type /openapi.json declares (`true` is not 1, "2" is not 2)."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False, strict=True)

    @property
    def unknown_fields(self) -> list[str]:
        return sorted(self.model_extra or {})


class ResponseModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(OpenAIBaseModel):
    include_usage: bool = False


class UsageInfo(ResponseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class ErrorInfo(ResponseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(ResponseModel):
    error: ErrorInfo


class ModelCard(ResponseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "llmserve"
    max_model_len: int


class ModelList(ResponseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def unix_time() -> int:
    return int(time.time())
