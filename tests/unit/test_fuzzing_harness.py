"""The schema-fuzzing harness (tests/fuzzing.py): reproducible seeds and bounded generation."""

from __future__ import annotations

import pytest

from tests.fuzzing import (
    MAX_NEW_TOKENS,
    SEED_ENV,
    SLOWEST_KEPT,
    FuzzReport,
    bound_generation,
    cap_new_tokens,
    fuzz_seed,
)


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


def test_integral_floats_are_integers_to_the_schema_and_are_capped_too() -> None:
    """JSON Schema counts 410.0 as an integer and the server takes it as 410: uncapped, such a
    draw generated 410 tokens for 20 prompts (16 s of a run that should take a minute)."""
    assert cap_new_tokens({"max_tokens": 410.0})["max_tokens"] == MAX_NEW_TOKENS
    assert cap_new_tokens({"max_completion_tokens": 300.0})["max_completion_tokens"] == MAX_NEW_TOKENS
    assert cap_new_tokens({"max_tokens": 4.5})["max_tokens"] == 4.5, "not an integer: the violation"
    assert cap_new_tokens({"max_tokens": 1e20})["max_tokens"] == 1e20, "past 2^53 the server refuses it"
    assert cap_new_tokens({"max_tokens": True})["max_tokens"] is True
    assert bound_generation({"n": 12.0})["n"] == 2


def test_schema_valid_requests_get_few_choices_and_a_long_enough_deadline() -> None:
    bounded = bound_generation({"n": 50, "timeout": 0.01})
    assert bounded["n"] == 2
    assert bounded["timeout"] >= 30


def test_the_report_says_where_the_time_went_and_keeps_the_slowest_cases() -> None:
    report = FuzzReport(seed=1)
    for i in range(SLOWEST_KEPT + 3):
        report.timed("POST /v1/completions", "positive", float(i), {"max_tokens": i, "prompt": ["a", "b"]})
    report.timed("POST /v1/completions", "negative", 0.5, [1, 2])
    assert [seconds for seconds, _ in report.slowest] == [float(i) for i in range(SLOWEST_KEPT + 2, 2, -1)]
    assert '"max_tokens": 7' in report.slowest[0][1]
    assert '"prompt": "list of 2, 10 chars"' in report.slowest[0][1]
    assert report.seconds[("POST /v1/completions", "positive")] == sum(range(SLOWEST_KEPT + 3))
    assert "slowest cases: 7.00 s POST /v1/completions [positive]" in report.summary()
