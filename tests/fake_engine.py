"""FakeEngine: a deterministic stand-in for vLLM, for fast unit tests of HTTP and protocol logic.

It "tokenizes" one token per whitespace-separated word and "generates" the words `w0 w1 ...`
for each of the n choices, one after the other.
A prompt containing FAIL_MID_STREAM makes it fail after the first token.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import asynccontextmanager

from llmserve.config import Config
from llmserve.engine.base import (
    ChatMessage,
    EngineClient,
    GenerationDelta,
    ModelInfo,
    PositionLogprobs,
    SamplingDefaults,
    SamplingSpec,
    StepListener,
    TokenizedPrompt,
    TokenLogprob,
)
from llmserve.errors import EngineFailedError

FAIL_MID_STREAM = "FAIL_MID_STREAM"


class FakeEngine:
    def __init__(
        self,
        max_model_len: int = 64,
        vocab_size: int = 1000,
        sampling_defaults: SamplingDefaults | None = None,
    ) -> None:
        self._model_info = ModelInfo(
            max_model_len=max_model_len,
            vocab_size=vocab_size,
            sampling_defaults=sampling_defaults or SamplingDefaults(),
        )
        self.dead = False
        self.aborted: list[str] = []
        self.started: list[str] = []
        self.token_delay_s = 0.0
        self.samplings: list[SamplingSpec] = []
        self.rendered: list[list[ChatMessage]] = []
        self.deltas_yielded = 0

    @property
    def model_info(self) -> ModelInfo:
        return self._model_info

    @property
    def is_dead(self) -> bool:
        return self.dead

    def watch_steps(self, listener: StepListener) -> None:
        pass

    async def tokenize(self, text: str) -> TokenizedPrompt:
        return TokenizedPrompt(token_ids=tuple(len(word) for word in text.split()), text=text)

    async def detokenize(self, token_ids: Sequence[int]) -> str:
        return " ".join(f"t{token_id}" for token_id in token_ids)

    async def render_chat(
        self, messages: Sequence[ChatMessage], add_generation_prompt: bool, continue_final_message: bool
    ) -> TokenizedPrompt:
        self.rendered.append(list(messages))
        text = " ".join(f"<{m.role}> {m.content}" for m in messages)
        if add_generation_prompt:
            text += " <assistant>"
        return await self.tokenize(text)

    async def generate(
        self, prompt: TokenizedPrompt, sampling: SamplingSpec, request_id: str
    ) -> AsyncGenerator[GenerationDelta, None]:
        self.started.append(request_id)
        self.samplings.append(sampling)
        finished = False
        try:
            for choice in range(sampling.n):
                for position, delta in enumerate(self._choice(prompt, sampling, choice)):
                    if position == 0 and sampling.prompt_logprobs is not None:
                        delta.prompt_logprobs = self._prompt_logprobs(prompt, sampling.prompt_logprobs)
                    if self.token_delay_s:
                        await asyncio.sleep(self.token_delay_s)
                    self.deltas_yielded += 1
                    yield delta
            finished = True
        finally:
            if not finished:
                self.aborted.append(request_id)

    def _choice(self, prompt: TokenizedPrompt, sampling: SamplingSpec, choice: int) -> list[GenerationDelta]:
        deltas = []
        for position in range(sampling.max_tokens):
            if position == 1 and prompt.text and FAIL_MID_STREAM in prompt.text:
                raise EngineFailedError("fake failure")
            word = f" w{position}"
            if word.strip() in sampling.stop:
                deltas.append(GenerationDelta(text="", token_ids=[], finish_reason="stop", index=choice))
                return deltas
            last = position == sampling.max_tokens - 1
            logprobs = None
            if sampling.logprobs is not None:
                chosen = TokenLogprob(position, word, -0.5)
                alternatives = [chosen, TokenLogprob(999, " zz", -3.0), TokenLogprob(998, " yy", -4.0)]
                logprobs = [PositionLogprobs(chosen, tuple(alternatives[: sampling.logprobs]))]
            deltas.append(
                GenerationDelta(
                    text=word,
                    token_ids=[position],
                    finish_reason="length" if last else None,
                    index=choice,
                    logprobs=logprobs,
                )
            )
        return deltas

    @staticmethod
    def _prompt_logprobs(prompt: TokenizedPrompt, top_n: int) -> list[PositionLogprobs | None]:
        """The first prompt token has no logprob; every later one -1.0, with one alternative."""
        positions: list[PositionLogprobs | None] = [None]
        for token_id in prompt.token_ids[1:]:
            chosen = TokenLogprob(token_id, f" t{token_id}", -1.0)
            positions.append(PositionLogprobs(chosen, (TokenLogprob(999, " zz", -0.1), chosen)[:top_n]))
        return positions


def fake_starter(engine: FakeEngine):  # type: ignore[no-untyped-def]
    @asynccontextmanager
    async def start(_: Config) -> AsyncIterator[EngineClient]:
        yield engine

    return start
