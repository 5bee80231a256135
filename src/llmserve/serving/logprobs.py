"""Engine logprobs in the two shapes OpenAI uses: completions' column lists and chat's entries."""

from __future__ import annotations

from collections.abc import Sequence

from llmserve.engine.base import PositionLogprobs
from llmserve.protocol.chat import ChoiceLogprobs, TokenLogprobEntry, TopLogprob
from llmserve.protocol.completions import CompletionLogprobs


def completion_logprobs(
    positions: Sequence[PositionLogprobs | None], text_offset_start: int, tokens_text: Sequence[str]
) -> CompletionLogprobs:
    """`positions[i] is None` for the first prompt token, which has no logprob (echo)."""
    offsets, offset = [], text_offset_start
    for token in tokens_text:
        offsets.append(offset)
        offset += len(token)
    return CompletionLogprobs(
        tokens=list(tokens_text),
        token_logprobs=[p.chosen.logprob if p else None for p in positions],
        top_logprobs=[_top_with_chosen(p) if p else None for p in positions],
        text_offset=offsets,
    )


def _top_with_chosen(position: PositionLogprobs) -> dict[str, float]:
    """OpenAI lists the sampled token among the top ones, so a position has up to logprobs + 1."""
    top = {position.chosen.token: position.chosen.logprob}
    top.update((candidate.token, candidate.logprob) for candidate in position.top)
    return top


def chat_logprobs(positions: Sequence[PositionLogprobs]) -> ChoiceLogprobs:
    return ChoiceLogprobs(
        content=[
            TokenLogprobEntry(
                token=position.chosen.token,
                logprob=position.chosen.logprob,
                bytes=list(position.chosen.token.encode()),
                top_logprobs=[
                    TopLogprob(token=top.token, logprob=top.logprob, bytes=list(top.token.encode()))
                    for top in position.top
                ],
            )
            for position in positions
        ]
    )
