"""Request fields shared by /v1/completions and /v1/chat/completions, and their engine mapping."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, TypeVar

from pydantic import Field, StringConstraints

from llmserve.engine.base import SamplingDefaults, SamplingSpec, StructuredOutput
from llmserve.errors import InvalidParameterError
from llmserve.protocol.common import INTEGRAL, OpenAIBaseModel, StreamOptions

MAX_N = 16
MAX_LOGPROBS = 20
MAX_STOP_SEQUENCES = 16
MAX_STOP_SEQUENCE_CHARS = 512
MAX_STOP_TOKEN_IDS = 64
MAX_LOGIT_BIAS_ENTRIES = 1024

# Marked so /openapi.json can bound token ids by the served model's vocabulary (api/openapi.py).
TOKEN_ID_MARK = "x-token-id"
TokenId = Annotated[int, Field(ge=0, json_schema_extra={TOKEN_ID_MARK: True}), INTEGRAL]
# Declared as types (not only validators) so /openapi.json tells clients and fuzzers the truth.
StopSequence = Annotated[str, StringConstraints(min_length=1, max_length=MAX_STOP_SEQUENCE_CHARS)]
TOKEN_ID_KEY_PATTERN = r"^[0-9]{1,9}$"
TokenIdKey = Annotated[str, StringConstraints(pattern=TOKEN_ID_KEY_PATTERN)]
Bias = Annotated[float, Field(ge=-100.0, le=100.0)]


def check_vocabulary(token_ids: Iterable[int], vocab_size: int, param: str) -> None:
    """Token ids a request names must exist in the served model's vocabulary."""
    for token_id in token_ids:
        if token_id >= vocab_size:
            raise InvalidParameterError(
                param, f"token id {token_id} is out of vocabulary (vocab_size={vocab_size})"
            )


class SamplingFields(OpenAIBaseModel):
    """OpenAI's sampling fields plus vLLM's common extensions (top_k, min_p, ...)."""

    model: str
    n: Annotated[int, Field(ge=1, le=MAX_N), INTEGRAL] = 1
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    # Bounded: vLLM ships requests to its engine core with msgpack, which refuses ints past 64 bits.
    top_k: Annotated[int, Field(ge=-1, le=2**31 - 1), INTEGRAL] | None = None
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=2.0)
    seed: Annotated[int, Field(ge=-(2**63), le=2**63 - 1), INTEGRAL] | None = None
    stop: StopSequence | Annotated[list[StopSequence], Field(max_length=MAX_STOP_SEQUENCES)] | None = None
    stop_token_ids: list[TokenId] | None = Field(default=None, max_length=MAX_STOP_TOKEN_IDS)
    ignore_eos: bool = False
    max_tokens: Annotated[int, Field(ge=1), INTEGRAL] | None = None
    logit_bias: dict[TokenIdKey, Bias] | None = Field(default=None, max_length=MAX_LOGIT_BIAS_ENTRIES)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # llmserve extension: finish within this many seconds (capped by server.request_timeout_s).
    timeout: float | None = Field(default=None, gt=0)
    # vLLM extension: a lower number is served first (admission's queue; vLLM's scheduler too when
    # engine.scheduling_policy is priority).
    priority: Annotated[int, Field(ge=-(2**31), le=2**31 - 1), INTEGRAL] = 0

    @property
    def include_usage_chunk(self) -> bool:
        return self.stream and self.stream_options is not None and self.stream_options.include_usage

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def logprobs_count(self) -> int | None:
        return None

    def structured_output(self) -> StructuredOutput | None:
        return None

    def check_token_ids(self, vocab_size: int) -> None:
        check_vocabulary(self.stop_token_ids or [], vocab_size, "stop_token_ids")
        check_vocabulary((int(key) for key in self.logit_bias or {}), vocab_size, "logit_bias")

    def to_sampling_spec(self, max_tokens: int, defaults: SamplingDefaults, **extra: Any) -> SamplingSpec:
        """The one place request fields become engine parameters: the user's value, else the model's
        default (its generation_config.json), else OpenAI's."""
        stops = [self.stop] if isinstance(self.stop, str) else self.stop or []
        temperature = _first(self.temperature, defaults.temperature, 1.0)
        if self.n > 1 and temperature == 0:
            raise InvalidParameterError(
                "n", "must be 1 with greedy sampling (temperature 0): its choices are equal"
            )
        return SamplingSpec(
            max_tokens=max_tokens,
            n=self.n,
            temperature=temperature,
            top_p=_first(self.top_p, defaults.top_p, 1.0),
            top_k=_first(self.top_k, defaults.top_k, 0),
            min_p=_first(self.min_p, defaults.min_p, 0.0),
            presence_penalty=_first(self.presence_penalty, defaults.presence_penalty, 0.0),
            frequency_penalty=_first(self.frequency_penalty, defaults.frequency_penalty, 0.0),
            repetition_penalty=_first(self.repetition_penalty, defaults.repetition_penalty, 1.0),
            seed=self.seed,
            stop=tuple(stops),
            stop_token_ids=tuple(self.stop_token_ids or ()),
            ignore_eos=self.ignore_eos,
            logprobs=self.logprobs_count(),
            logit_bias={int(key): bias for key, bias in self.logit_bias.items()} if self.logit_bias else None,
            structured_output=self.structured_output(),
            priority=self.priority,
            incremental=self.stream,
            **extra,
        )


T = TypeVar("T")


def _first(value: T | None, model_default: T | None, openai_default: T) -> T:
    if value is not None:
        return value
    return openai_default if model_default is None else model_default
