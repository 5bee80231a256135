"""OpenAI `/v1/completions` wire types."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints, WithJsonSchema

from llmserve.errors import InvalidParameterError, UnsupportedParameterError
from llmserve.protocol.common import INTEGRAL, ResponseModel, UsageInfo
from llmserve.protocol.sampling import MAX_LOGPROBS, SamplingFields, TokenId, check_vocabulary

# Non-empty at every level, so /openapi.json admits no prompt the server must refuse as empty.
PromptText = Annotated[str, StringConstraints(min_length=1)]
PromptTokens = Annotated[list[TokenId], Field(min_length=1)]
PromptInput = (
    PromptText
    | Annotated[list[PromptText], Field(min_length=1)]
    | PromptTokens
    | Annotated[list[PromptTokens], Field(min_length=1)]
)


def _no_op_or_null(value: object) -> dict[str, object]:
    return {"anyOf": [{"const": value}, {"type": "null"}]}


# OpenAI's and vLLM's default for completions; null asks for the rest of the context window.
DEFAULT_COMPLETION_TOKENS = 16


class CompletionRequest(SamplingFields):
    prompt: PromptInput
    # 0 only with echo: score the prompt without generating (what GPT-3-era evaluation clients send).
    max_tokens: Annotated[int, Field(ge=0), INTEGRAL] | None = DEFAULT_COMPLETION_TOKENS
    echo: bool = False
    logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS), INTEGRAL] | None = None
    # Known OpenAI fields this server does not implement: accepted only at their no-op values.
    # The schema shows only those values, so generated clients send nothing the server refuses.
    best_of: Annotated[int | None, INTEGRAL, WithJsonSchema(_no_op_or_null(1))] = None
    suffix: Annotated[str | None, WithJsonSchema(_no_op_or_null(""))] = None

    def check_fields(self) -> None:
        """What the schema cannot say: values this server does not serve, combinations it refuses."""
        if self.best_of not in (None, 1):
            raise UnsupportedParameterError("best_of", "is not supported (vLLM V1 removed it); use n")
        if self.suffix:
            raise UnsupportedParameterError("suffix", "is not supported (no fill-in-the-middle model)")
        if self.max_tokens == 0 and not self.echo:
            raise InvalidParameterError("max_tokens", "must be at least 1 unless echo is true")

    @property
    def echo_only(self) -> bool:
        """Return the prompt (and its logprobs) without any generated text."""
        return self.echo and self.max_tokens == 0

    def logprobs_count(self) -> int | None:
        return self.logprobs

    def check_token_ids(self, vocab_size: int) -> None:
        super().check_token_ids(vocab_size)
        for prompt in self.prompts():
            if not isinstance(prompt, str):
                check_vocabulary(prompt, vocab_size, "prompt")

    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt: a text or a list of token ids."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if all(isinstance(item, int) for item in prompt):
            return [list(prompt)]  # type: ignore[arg-type]
        return list(prompt)  # type: ignore[arg-type]


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
