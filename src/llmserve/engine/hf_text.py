"""Tokenizing, detokenizing and chat templates with a Hugging Face tokenizer, for every engine."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from llmserve.engine.base import ChatMessage, TokenizedPrompt
from llmserve.errors import EngineRefusedError

# Tokenizing a long prompt takes milliseconds: do it off the event loop.
LONG_PROMPT_CHARS = 4096


class TextCodec:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    async def tokenize(self, text: str) -> TokenizedPrompt:
        return TokenizedPrompt(token_ids=await self._encode(text, add_special_tokens=True), text=text)

    async def _encode(self, text: str, add_special_tokens: bool) -> tuple[int, ...]:
        if len(text) > LONG_PROMPT_CHARS:
            token_ids = await asyncio.to_thread(
                self.tokenizer.encode, text, add_special_tokens=add_special_tokens
            )
        else:
            token_ids = self.tokenizer.encode(text, add_special_tokens=add_special_tokens)
        return tuple(token_ids)

    async def detokenize(self, token_ids: Sequence[int]) -> str:
        text: str = self.tokenizer.decode(list(token_ids))
        return text

    async def render_chat(
        self, messages: Sequence[ChatMessage], add_generation_prompt: bool, continue_final_message: bool
    ) -> TokenizedPrompt:
        conversation = [{"role": message.role, "content": message.content} for message in messages]
        try:
            text: str = self.tokenizer.apply_chat_template(
                conversation,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
            )
        except Exception as exc:  # jinja2 raises its own errors for conversations it refuses
            raise EngineRefusedError(
                f"The model's chat template refused the messages: {exc}", param="messages"
            ) from exc
        # The template writes the special tokens itself.
        return TokenizedPrompt(token_ids=await self._encode(text, add_special_tokens=False), text=text)


class HfTextEngine:
    """The text half of the EngineClient protocol, for engines that tokenize with `self._text`."""

    _text: TextCodec

    async def tokenize(self, text: str) -> TokenizedPrompt:
        return await self._text.tokenize(text)

    async def detokenize(self, token_ids: Sequence[int]) -> str:
        return await self._text.detokenize(token_ids)

    async def render_chat(
        self, messages: Sequence[ChatMessage], add_generation_prompt: bool, continue_final_message: bool
    ) -> TokenizedPrompt:
        return await self._text.render_chat(messages, add_generation_prompt, continue_final_message)
