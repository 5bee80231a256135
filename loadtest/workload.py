"""Seeded request shapes shared by the load generators: same seed, same prompts and lengths."""

from __future__ import annotations

import random

VOCABULARY = "the quick brown fox jumps over a lazy dog while seven curious cats watch".split()  # noqa: SIM905


def seeded_prompt(rng: random.Random, min_words: int, max_words: int) -> str:
    return " ".join(rng.choices(VOCABULARY, k=rng.randint(min_words, max_words)))
