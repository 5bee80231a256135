"""The margin a promise of time keeps: the 99th percentile of how late recent promises came true."""

from __future__ import annotations

import pytest

from llmserve.policy.tail_margin import (
    CEILING_SHARE,
    MAX_AGE_S,
    MIN_SAMPLES,
    PRIOR_SHARE,
    WINDOW,
    TailMargin,
)


def test_until_promises_come_due_it_keeps_a_tenth_of_the_horizon_or_the_latest_seen() -> None:
    margin = TailMargin(horizon_s=10.0)
    assert margin.seconds == pytest.approx(PRIOR_SHARE * 10.0)
    margin.observe(promised_at=5.0, happened_at=4.0)  # early
    assert margin.seconds == pytest.approx(PRIOR_SHARE * 10.0)
    margin.observe(promised_at=5.0, happened_at=7.0)  # 2 s late
    assert margin.seconds == pytest.approx(2.0)
    assert (margin.kept, margin.broken) == (1, 1)


def test_it_is_the_99th_percentile_of_lateness_one_outlier_in_a_window_does_not_move_it_two_do() -> None:
    margin = TailMargin(horizon_s=10.0)
    for _ in range(WINDOW - 1):
        margin.observe(0.0, 0.3)
    margin.observe(0.0, 4.0)
    assert margin.seconds == pytest.approx(0.3)
    margin.observe(0.0, 4.0)
    assert margin.seconds == pytest.approx(4.0)


def test_promises_kept_early_leave_no_margin_and_outliers_never_shut_the_door() -> None:
    margin = TailMargin(horizon_s=10.0)
    for _ in range(MIN_SAMPLES):
        margin.observe(10.0, 9.0)
    assert margin.seconds == 0.0
    for _ in range(MIN_SAMPLES):
        margin.observe(0.0, 60.0)
    assert margin.seconds == pytest.approx(CEILING_SHARE * 10.0)


def test_it_follows_the_last_window_of_promises() -> None:
    margin = TailMargin(horizon_s=10.0)
    for _ in range(WINDOW):
        margin.observe(0.0, 2.0)  # an overload whose predictions ran late
    for _ in range(WINDOW):
        margin.observe(0.0, 0.1)
    assert margin.seconds == pytest.approx(0.1)


def test_what_promises_taught_is_forgotten_after_a_quiet_spell() -> None:
    now = [0.0]
    margin = TailMargin(horizon_s=10.0, clock=lambda: now[0])
    for _ in range(WINDOW):
        margin.observe(0.0, 3.0)  # an overload long past
    now[0] += MAX_AGE_S / 2
    assert margin.seconds == pytest.approx(3.0)
    now[0] += MAX_AGE_S
    assert margin.seconds == pytest.approx(PRIOR_SHARE * 10.0)
