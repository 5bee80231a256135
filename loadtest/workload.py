"""Seeded request shapes shared by the load generators: same seed, same prompts and lengths."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

VOCABULARY = "the quick brown fox jumps over a lazy dog while seven curious cats watch".split()  # noqa: SIM905


def seeded_prompt(rng: random.Random, min_words: int, max_words: int) -> str:
    return " ".join(rng.choices(VOCABULARY, k=rng.randint(min_words, max_words)))


@dataclass(frozen=True)
class RequestShape:
    """One benchmark request: what to send, how much to generate, when (seconds after the start)."""

    prompt: str
    max_tokens: int
    arrival_s: float = 0.0


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    requests: tuple[RequestShape, ...]
    concurrency: int | None = None  # None: open loop (arrival times); N: N clients back to back


def offline_batch(count: int, prompt_words: int, max_tokens: int, seed: int = 0) -> Workload:
    """Equal-length requests all at once: the offline batch that flatters static batching."""
    rng = random.Random(seed)
    shapes = tuple(
        RequestShape(seeded_prompt(rng, prompt_words, prompt_words), max_tokens) for _ in range(count)
    )
    return Workload(
        f"batch-{count}x{max_tokens}", f"{count} equal requests at t=0, {max_tokens} tokens out", shapes
    )


def poisson_arrivals(
    count: int,
    rate_per_s: float,
    seed: int = 0,
    prompt_words: tuple[int, int] = (8, 400),
    output_tokens: tuple[int, int] = (16, 160),
) -> Workload:
    """Requests arriving over time (Poisson), prompt and output lengths drawn log-uniformly."""
    rng = random.Random(seed)
    arrival, shapes = 0.0, []
    for _ in range(count):
        arrival += rng.expovariate(rate_per_s)
        words = _log_uniform(rng, *prompt_words)
        shapes.append(
            RequestShape(seeded_prompt(rng, words, words), _log_uniform(rng, *output_tokens), arrival)
        )
    return Workload(
        f"poisson-{rate_per_s:g}rps",
        f"{count} Poisson arrivals at {rate_per_s:g} req/s, "
        f"prompt {prompt_words[0]}-{prompt_words[1]} words, "
        f"output {output_tokens[0]}-{output_tokens[1]} tokens",
        tuple(shapes),
    )


def repetitive_text(count: int, concurrency: int, max_tokens: int, seed: int = 0) -> Workload:
    """Quoting given text back: where prompt-lookup (ngram) speculation finds its drafts."""
    rng = random.Random(seed)
    shapes = []
    for _ in range(count):
        passage = seeded_prompt(rng, 40, 60)
        prompt = f"Copy the text exactly.\nText: {passage}\nCopy: {passage}\nText: {passage}\nCopy:"
        shapes.append(RequestShape(prompt, max_tokens))
    return Workload(
        f"repetitive-c{concurrency}",
        f"{count} copy-the-text requests, {concurrency} at a time, {max_tokens} tokens out",
        tuple(shapes),
        concurrency=concurrency,
    )


def shared_system_prompt(count: int, max_tokens: int, seed: int = 0) -> Workload:
    """One long system prompt (hundreds of tokens) before distinct questions, one at a time."""
    rng = random.Random(seed)
    system = "You are a support agent. " + " ".join(
        f"Rule {i}: {seeded_prompt(rng, 8, 8)}." for i in range(60)
    )
    shapes = tuple(
        RequestShape(f"{system}\nQuestion {i}: {seeded_prompt(rng, 6, 12)}?\nAnswer:", max_tokens)
        for i in range(count)
    )
    return Workload(
        "shared-prefix-c1", f"{count} requests sharing a ~700-token prefix, one at a time", shapes, 1
    )


def _log_uniform(rng: random.Random, low: int, high: int) -> int:
    return max(low, min(high, round(math.exp(rng.uniform(math.log(low), math.log(high))))))


OPEN_ENDED_TASKS = (
    "Write a short story about",
    "Explain to a child why",
    "Describe a day in the life of",
    "Give advice to someone who worries that",
    "Write a product description for",
)


def open_ended_text(count: int, concurrency: int, max_tokens: int, seed: int = 0) -> Workload:
    """Ordinary generation: open-ended tasks whose answer is not in the prompt."""
    rng = random.Random(seed)
    shapes = tuple(
        RequestShape(f"{rng.choice(OPEN_ENDED_TASKS)} {seeded_prompt(rng, 3, 8)}.\n", max_tokens)
        for _ in range(count)
    )
    return Workload(
        f"open-ended-c{concurrency}",
        f"{count} open-ended requests, {concurrency} at a time, {max_tokens} tokens out",
        shapes,
        concurrency=concurrency,
    )
