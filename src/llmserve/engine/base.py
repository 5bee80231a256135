"""The engine boundary: what the serving layer may ask of any engine (vLLM, transformers, fake).

Types here are engine-neutral on purpose: nothing above `engine/` imports vLLM. Engines raise the
server's own errors (llmserve/errors.py): EngineDeadError, EngineFailedError, EngineRefusedError.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    """Constrain the output: any JSON object, or JSON matching `json_schema`."""

    json_schema: dict[str, Any] | None = None
    json_object: bool = False


@dataclass(frozen=True, slots=True)
class SamplingSpec:
    """Sampling parameters in engine-neutral form; each engine maps them to its own type."""

    max_tokens: int
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    logit_bias: dict[int, float] | None = None
    structured_output: StructuredOutput | None = None
    priority: int = 0  # lower first; honoured by engines that schedule by priority
    # False: the caller wants each choice whole, not token by token (a response that is not
    # streamed); an engine may then deliver one delta per choice, with its TokenTiming.
    incremental: bool = True


@dataclass(frozen=True, slots=True)
class TokenizedPrompt:
    token_ids: tuple[int, ...]
    text: str | None = None


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token_id: int
    token: str
    logprob: float


@dataclass(frozen=True, slots=True)
class PositionLogprobs:
    """The chosen token at one position and the most likely alternatives there."""

    chosen: TokenLogprob
    top: tuple[TokenLogprob, ...]


@dataclass(frozen=True, slots=True)
class TokenTiming:
    """When the tokens of a delta were made, for a delta carrying many at once (a choice delivered
    whole): seconds before the delta was delivered, so each observer places them on its own
    clock. Without it, a delta's tokens were made just before it was delivered."""

    first_token_ago_s: float
    last_token_ago_s: float

    def placed(self, now: float) -> tuple[float, float]:
        """(first token, last token) on the clock that reads `now`."""
        return now - self.first_token_ago_s, now - self.last_token_ago_s


@dataclass(slots=True)
class GenerationDelta:
    """New text and tokens of one choice (`index` < n) since its previous delta."""

    text: str
    token_ids: Sequence[int]
    finish_reason: str | None = None
    index: int = 0
    logprobs: list[PositionLogprobs] | None = None
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    timing: TokenTiming | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str
    content: str


@dataclass(frozen=True, slots=True)
class SamplingDefaults:
    """Defaults for the sampling fields a request omits, from the model's `generation_config.json`
    (as vLLM's `--generation-config auto` reads it); unset fields fall back to OpenAI's defaults."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    max_tokens: int | None = None

    @classmethod
    def from_generation_config(cls, values: Mapping[str, Any]) -> SamplingDefaults:
        """From generation-config keys (Hugging Face's `max_new_tokens` is `max_tokens`)."""
        renamed = {("max_tokens" if key == "max_new_tokens" else key): value for key, value in values.items()}
        return cls(**{name: renamed.get(name) for name in SAMPLING_DEFAULT_FIELDS})

    def in_effect(self) -> dict[str, float | int]:
        return {name: value for name in SAMPLING_DEFAULT_FIELDS if (value := getattr(self, name)) is not None}


SAMPLING_DEFAULT_FIELDS = tuple(SamplingDefaults.__dataclass_fields__)


@dataclass(frozen=True, slots=True)
class ModelInfo:
    max_model_len: int
    vocab_size: int
    sampling_defaults: SamplingDefaults = SamplingDefaults()
    kv_cache_tokens: int | None = None  # what the engine's KV cache holds, once it has told


# An engine's own timing of its steps: (seconds one step took, sequences it ran, or None when not
# known to this process; prompt tokens whose prefill it finished).
StepListener = Callable[[float, int | None, int], None]


@runtime_checkable
class EngineClient(Protocol):
    """A started engine. Start and stop it with the async context manager its module provides."""

    @property
    def model_info(self) -> ModelInfo: ...

    @property
    def is_dead(self) -> bool: ...

    def watch_steps(self, listener: StepListener) -> None:
        """Call `listener` with every step's time by the engine's own clock, if this engine times
        its steps (if not, it never calls: then relayed tokens tell how long steps take)."""
        ...

    async def tokenize(self, text: str) -> TokenizedPrompt: ...

    async def detokenize(self, token_ids: Sequence[int]) -> str: ...

    async def render_chat(
        self, messages: Sequence[ChatMessage], add_generation_prompt: bool, continue_final_message: bool
    ) -> TokenizedPrompt:
        """Apply the model's own chat template; raise EngineRefusedError if it refuses."""
        ...

    def generate(
        self, prompt: TokenizedPrompt, sampling: SamplingSpec, request_id: str
    ) -> AsyncGenerator[GenerationDelta, None]:
        """Yield deltas until one carries a finish_reason. Closing the generator (or cancelling the task
        iterating it) aborts the request in the engine."""
        ...
