"""OpenAI `/v1/chat/completions` wire types."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from llmserve.engine.base import ChatMessage, StructuredOutput
from llmserve.protocol.common import OpenAIBaseModel, ResponseModel, UsageInfo
from llmserve.protocol.sampling import (
    MAX_LOGPROBS,
    InvalidParameterError,
    SamplingFields,
    UnsupportedParameterError,
)

MAX_MESSAGES = 1024


class ContentPart(OpenAIBaseModel):
    type: str
    text: str | None = None


class ChatMessageParam(OpenAIBaseModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart] | None = None
    name: str | None = None

    def to_engine_message(self, position: int) -> ChatMessage:
        param = f"messages.{position}.content"
        extra = self.model_extra or {}
        for field in ("tool_calls", "function_call", "audio"):
            if extra.get(field):
                raise UnsupportedParameterError(f"messages.{position}.{field}", "is not supported")
        if self.content is None:
            if self.role != "assistant":
                raise InvalidParameterError(param, "content is required")
            text = ""
        elif isinstance(self.content, str):
            text = self.content
        else:
            parts = []
            for part in self.content:
                if part.type not in ("text", "input_text") or part.text is None:
                    raise UnsupportedParameterError(
                        param, f"has a '{part.type}' part; this model takes text parts only"
                    )
                parts.append(part.text)
            text = "\n".join(parts)
        role = "system" if self.role == "developer" else self.role
        return ChatMessage(role=role, content=text)


class JsonSchemaFormat(OpenAIBaseModel):
    model_config = ConfigDict(populate_by_name=True)

    name: str = Field(default="response", max_length=64)
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(strict=True)

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_present(self) -> ResponseFormat:
        if self.type == "json_schema" and (self.json_schema is None or self.json_schema.json_schema is None):
            raise ValueError("type 'json_schema' needs json_schema.schema")
        return self


# Fields OpenAI defines that this server does not implement: a 400 naming them, never ignored.
_UNSUPPORTED_WHEN_SET = {
    "tools": "is not supported: this server does not do tool calling",
    "functions": "is not supported: this server does not do function calling",
    "function_call": "is not supported: this server does not do function calling",
    "audio": "is not supported: the model produces text only",
    "prediction": "is not supported",
    "web_search_options": "is not supported",
    "reasoning_effort": "is not supported: the model does not reason",
}


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessageParam] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    response_format: ResponseFormat | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    tool_choice: Any = None
    modalities: list[str] | None = None

    def reject_unsupported(self) -> None:
        extra = self.model_extra or {}
        for field, reason in _UNSUPPORTED_WHEN_SET.items():
            if extra.get(field):
                raise UnsupportedParameterError(field, reason)
        if self.tool_choice not in (None, "none", "auto"):
            raise UnsupportedParameterError("tool_choice", "is not supported: no tool calling")
        if self.modalities not in (None, ["text"]):
            raise UnsupportedParameterError("modalities", "must be ['text']")
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidParameterError("top_logprobs", "requires logprobs to be true")
        if self.add_generation_prompt and self.continue_final_message:
            raise InvalidParameterError(
                "continue_final_message", "cannot be combined with add_generation_prompt"
            )

    def unknown_fields_ignored(self) -> list[str]:
        return [field for field in self.unknown_fields if field not in _UNSUPPORTED_WHEN_SET]

    def engine_messages(self) -> list[ChatMessage]:
        return [message.to_engine_message(i) for i, message in enumerate(self.messages)]

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def logprobs_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def structured_output(self) -> StructuredOutput | None:
        response_format = self.response_format
        if response_format is None or response_format.type == "text":
            return None
        if response_format.type == "json_object":
            return StructuredOutput(json_object=True)
        assert response_format.json_schema is not None
        return StructuredOutput(json_schema=response_format.json_schema.json_schema)


class TopLogprob(ResponseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprobEntry(ResponseModel):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(ResponseModel):
    content: list[TokenLogprobEntry] | None
    refusal: None = None


class AssistantMessage(ResponseModel):
    role: Literal["assistant"] = "assistant"
    content: str
    refusal: None = None


class ChatChoice(ResponseModel):
    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None


class ChatCompletionResponse(ResponseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    system_fingerprint: str | None = None
    service_tier: str | None = None


class DeltaMessage(ResponseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatStreamChoice(ResponseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionStreamResponse(ResponseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatStreamChoice]
    usage: UsageInfo | None = None
    system_fingerprint: str | None = None
