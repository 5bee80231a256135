"""OpenAI `/v1/completions` wire types."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from llmserve.protocol.common import ResponseModel, UsageInfo
from llmserve.protocol.sampling import (
    MAX_LOGPROBS,
    SamplingFields,
    TokenId,
    UnsupportedParameterError,
)

# Non-empty at every level, so /openapi.json admits no prompt the server must refuse as empty.
PromptText = Annotated[str, StringConstraints(min_length=1)]
PromptTokens = Annotated[list[TokenId], Field(min_length=1)]
PromptInput = (
    PromptText
    | Annotated[list[PromptText], Field(min_length=1)]
    | PromptTokens
    | Annotated[list[PromptTokens], Field(min_length=1)]
)


class CompletionRequest(SamplingFields):
    prompt: PromptInput
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    # Known OpenAI fields this server does not implement: accepted only at their no-op values.
    best_of: int | None = Field(default=None, ge=1)
    suffix: str | None = None

    def reject_unsupported(self) -> None:
        if self.best_of not in (None, 1):
            raise UnsupportedParameterError("best_of", "is not supported (vLLM V1 removed it); use n")
        if self.suffix:
            raise UnsupportedParameterError("suffix", "is not supported (no fill-in-the-middle model)")

    def logprobs_count(self) -> int | None:
        return self.logprobs


class CompletionLogprobs(ResponseModel):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(ResponseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
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
