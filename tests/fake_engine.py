"""FakeEngine: a deterministic stand-in for vLLM, for fast unit tests of HTTP and protocol logic.

It "tokenizes" one token per whitespace-separated word and "generates" the words `w0 w1 ...`.
A prompt containing FAIL_MID_STREAM makes it fail after the first token.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from llmserve.config import Config
from llmserve.engine.base import (
    EngineClient,
    EngineError,
    GenerationDelta,
    ModelInfo,
    SamplingSpec,
    TokenizedPrompt,
)

FAIL_MID_STREAM = "FAIL_MID_STREAM"


class FakeEngine:
    def __init__(self, max_model_len: int = 64, vocab_size: int = 1000) -> None:
        self._model_info = ModelInfo(max_model_len=max_model_len, vocab_size=vocab_size)
        self.dead = False
        self.aborted: list[str] = []
        self.started: list[str] = []
        self.token_delay_s = 0.0

    @property
    def model_info(self) -> ModelInfo:
        return self._model_info

    @property
    def is_dead(self) -> bool:
        return self.dead

    async def tokenize(self, text: str) -> TokenizedPrompt:
        return TokenizedPrompt(token_ids=tuple(len(word) for word in text.split()), text=text)

    async def generate(
        self, prompt: TokenizedPrompt, sampling: SamplingSpec, request_id: str
    ) -> AsyncIterator[GenerationDelta]:
        self.started.append(request_id)
        finished = False
        try:
            for index in range(sampling.max_tokens):
                if self.token_delay_s:
                    await asyncio.sleep(self.token_delay_s)
                if index == 1 and prompt.text and FAIL_MID_STREAM in prompt.text:
                    raise EngineError("fake failure")
                word = f" w{index}"
                if word.strip() in sampling.stop:
                    finished = True
                    yield GenerationDelta(text="", token_ids=[], finish_reason="stop")
                    return
                last = index == sampling.max_tokens - 1
                finished = last
                yield GenerationDelta(text=word, token_ids=[index], finish_reason="length" if last else None)
        finally:
            if not finished:
                self.aborted.append(request_id)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    async def check_health(self) -> None:
        if self.dead:
            raise EngineError("dead")


def fake_starter(engine: FakeEngine):  # type: ignore[no-untyped-def]
    @asynccontextmanager
    async def start(_: Config) -> AsyncIterator[EngineClient]:
        yield engine

    return start
