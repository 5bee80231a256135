"""OpenAI `/v1/chat/completions` wire types."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from llmserve.engine.base import ChatMessage, StructuredOutput
from llmserve.errors import InvalidParameterError, UnsupportedParameterError
from llmserve.protocol.common import INTEGRAL, OpenAIBaseModel, ResponseModel, UsageInfo
from llmserve.protocol.sampling import MAX_LOGPROBS, SamplingFields

MAX_MESSAGES = 1024


class TextPart(OpenAIBaseModel):
    type: Literal["text"]
    text: str


# Parts are told apart by `type`; this model takes text only, so any other part type is a 400
# unsupported_parameter (see api/errors.py: an unknown tag of a discriminated union).
ContentPart = Annotated[TextPart, Field(discriminator="type")]
Content = str | list[ContentPart]


class _MessageParam(OpenAIBaseModel):
    content: Content | None
    name: str | None = None

    def to_engine_message(self, position: int) -> ChatMessage:
        extra = self.model_extra or {}
        for field in ("tool_calls", "function_call", "audio"):
            if extra.get(field):
                raise UnsupportedParameterError(f"messages.{position}.{field}", "is not supported")
        if self.content is None:
            text = ""
        elif isinstance(self.content, str):
            text = self.content
        else:
            text = "\n".join(part.text for part in self.content)
        return ChatMessage(role=self.engine_role, content=text)

    @property
    def engine_role(self) -> str:
        raise NotImplementedError


class SystemMessageParam(_MessageParam):
    role: Literal["system", "developer"]
    content: Content

    @property
    def engine_role(self) -> str:
        return "system"  # `developer` is OpenAI's new name for it


class UserMessageParam(_MessageParam):
    role: Literal["user"]
    content: Content

    @property
    def engine_role(self) -> str:
        return "user"


class AssistantMessageParam(_MessageParam):
    role: Literal["assistant"]
    content: Content | None = None  # may be omitted when the turn only called tools

    @property
    def engine_role(self) -> str:
        return "assistant"


# Discriminated by role, so /openapi.json says exactly which fields each role needs (a user
# message must have content; an assistant message may omit it). Roles not listed (tool, function)
# are a 400 unsupported_parameter naming messages.N.role.
ChatMessageParam = Annotated[
    SystemMessageParam | UserMessageParam | AssistantMessageParam, Field(discriminator="role")
]
# The tags of this module's discriminated unions, which pydantic writes into an error's location
# right after the list index of a message or part, or after the field holding one (response_format).
UNION_TAGS = frozenset({"system", "developer", "user", "assistant", "text", "json_object", "json_schema"})
TAGGED_UNION_FIELDS = frozenset({"response_format"})


class JsonSchemaFormat(OpenAIBaseModel):
    model_config = ConfigDict(populate_by_name=True)

    name: str = Field(default="response", max_length=64)
    description: str | None = None
    json_schema: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class _Format(BaseModel):
    model_config = ConfigDict(strict=True)


class TextFormat(_Format):
    type: Literal["text"]


class JsonObjectFormat(_Format):
    type: Literal["json_object"]


class JsonSchemaResponseFormat(_Format):
    type: Literal["json_schema"]
    json_schema: JsonSchemaFormat


ResponseFormat = Annotated[
    TextFormat | JsonObjectFormat | JsonSchemaResponseFormat, Field(discriminator="type")
]


TEXT_ONLY_MODALITIES = {
    "anyOf": [{"type": "array", "items": {"const": "text"}, "minItems": 1, "maxItems": 1}, {"type": "null"}]
}

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
    max_completion_tokens: Annotated[int, Field(ge=1), INTEGRAL] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS), INTEGRAL] | None = None
    response_format: ResponseFormat | None = None
    # Unset: true, unless continue_final_message asks to extend the last message instead.
    add_generation_prompt: bool | None = None
    continue_final_message: bool = False
    tool_choice: Any = None
    # Served only as ["text"]; the schema says so, and anything else is a 400 unsupported_parameter.
    modalities: Annotated[list[str] | None, WithJsonSchema(TEXT_ONLY_MODALITIES)] = None

    def check_fields(self) -> None:
        """What the schema cannot say: fields this server does not serve, combinations it refuses."""
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
        if self.add_generation_prompt and self.continue_final_message:  # both given as true
            raise InvalidParameterError(
                "continue_final_message", "cannot be combined with add_generation_prompt"
            )

    def unknown_fields_ignored(self) -> list[str]:
        return [field for field in self.unknown_fields if field not in _UNSUPPORTED_WHEN_SET]

    @property
    def opens_assistant_turn(self) -> bool:
        if self.add_generation_prompt is None:
            return not self.continue_final_message
        return self.add_generation_prompt

    def engine_messages(self) -> list[ChatMessage]:
        return [message.to_engine_message(i) for i, message in enumerate(self.messages)]

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def logprobs_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def structured_output(self) -> StructuredOutput | None:
        response_format = self.response_format
        if isinstance(response_format, JsonObjectFormat):
            return StructuredOutput(json_object=True)
        if isinstance(response_format, JsonSchemaResponseFormat):
            return StructuredOutput(json_schema=response_format.json_schema.json_schema)
        return None


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
