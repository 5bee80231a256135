"""OpenAI `/v1/completions` wire types and their mapping to engine sampling parameters."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from llmserve.engine.base import SamplingSpec
from llmserve.protocol.common import (
    OpenAIBaseModel,
    ResponseModel,
    StreamOptions,
    UsageInfo,
)

MAX_STOP_SEQUENCES = 16
MAX_STOP_SEQUENCE_CHARS = 512

TokenId = Annotated[int, Field(ge=0)]
PromptInput = str | list[str] | list[TokenId] | list[list[TokenId]]


class UnsupportedParameterError(ValueError):
    def __init__(self, param: str, reason: str) -> None:
        super().__init__(f"'{param}' {reason}")
        self.param = param


class CompletionRequest(OpenAIBaseModel):
    model: str
    prompt: PromptInput
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), le=2**64 - 1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # Known OpenAI fields this server does not implement: accepted only at their no-op values.
    best_of: int | None = Field(default=None, ge=1)
    suffix: str | None = None
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0)

    @field_validator("stop")
    @classmethod
    def _bounded_stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > MAX_STOP_SEQUENCES:
            raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences are allowed")
        if any(len(stop) > MAX_STOP_SEQUENCE_CHARS for stop in stops):
            raise ValueError(f"a stop sequence may be at most {MAX_STOP_SEQUENCE_CHARS} characters")
        if any(stop == "" for stop in stops):
            raise ValueError("stop sequences must not be empty")
        return value

    def reject_unsupported(self) -> None:
        if self.best_of not in (None, 1):
            raise UnsupportedParameterError("best_of", "is not supported (vLLM V1 removed it)")
        if self.n != 1:
            raise UnsupportedParameterError("n", "must be 1 on this server")
        if self.suffix:
            raise UnsupportedParameterError("suffix", "is not supported")
        if self.echo:
            raise UnsupportedParameterError("echo", "is not supported")
        if self.logprobs is not None:
            raise UnsupportedParameterError("logprobs", "is not supported")

    @property
    def include_usage_chunk(self) -> bool:
        return self.stream and self.stream_options is not None and self.stream_options.include_usage

    def stop_sequences(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def to_sampling_spec(self, default_max_tokens: int) -> SamplingSpec:
        """The one place request fields become engine parameters: user value, else OpenAI's default."""
        return SamplingSpec(
            max_tokens=self.max_tokens if self.max_tokens is not None else default_max_tokens,
            temperature=self.temperature if self.temperature is not None else 1.0,
            top_p=self.top_p if self.top_p is not None else 1.0,
            seed=self.seed,
            stop=self.stop_sequences(),
        )


class CompletionChoice(ResponseModel):
    index: int
    text: str
    logprobs: None = None
    finish_reason: str | None


class CompletionResponse(ResponseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo
    system_fingerprint: str | None = None


class CompletionStreamResponse(ResponseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None
    system_fingerprint: str | None = None
