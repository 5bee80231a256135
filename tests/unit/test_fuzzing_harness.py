"""The schema-fuzzing harness (tests/fuzzing.py): reproducible seeds and bounded generation."""

from __future__ import annotations

import pytest

from tests.fuzzing import MAX_NEW_TOKENS, SEED_ENV, bound_generation, cap_new_tokens, fuzz_seed


def test_the_seed_is_the_default_unless_the_environment_names_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SEED_ENV, raising=False)
    assert fuzz_seed(7) == 7
    monkeypatch.setenv(SEED_ENV, "12345")
    assert fuzz_seed(7) == 12345


def test_random_draws_a_fresh_seed_each_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SEED_ENV, "random")
    seeds = {fuzz_seed(7) for _ in range(8)}
    assert len(seeds) > 1
    assert all(0 <= s < 2**32 for s in seeds)


def test_new_tokens_are_capped_unless_max_tokens_is_the_violation() -> None:
    assert cap_new_tokens({"max_tokens": 500})["max_tokens"] == MAX_NEW_TOKENS
    assert cap_new_tokens({"prompt": "x"})["max_tokens"] == MAX_NEW_TOKENS
    assert cap_new_tokens({"max_tokens": -3})["max_tokens"] == -3
    assert cap_new_tokens({"max_tokens": "many"})["max_tokens"] == "many"
    assert cap_new_tokens([1, 2]) == [1, 2]


def test_schema_valid_requests_get_few_choices_and_a_long_enough_deadline() -> None:
    bounded = bound_generation({"n": 50, "timeout": 0.01})
    assert bounded["n"] == 2
    assert bounded["timeout"] >= 30
