"""The queue's headroom: how much of its wait budget a queued request may be promised, steered by
how the queued requests fared, so that about 1 in 100 misses its target."""

from __future__ import annotations

import pytest

from llmserve.policy.headroom import IDLE_S, MET_GAIN, MISS_COST, RELAX_S, SHARE_BOUNDS, START_SHARE, Headroom


def test_it_starts_at_the_whole_budget_and_moves_down_a_lot_per_miss_up_a_little_per_met_target() -> None:
    headroom = Headroom()
    assert headroom.share == START_SHARE == SHARE_BOUNDS[1]
    headroom.observe(met_target=True)
    assert headroom.share == SHARE_BOUNDS[1]  # never more than the whole budget
    headroom.observe(met_target=False)
    assert headroom.share == pytest.approx(START_SHARE - MISS_COST)
    headroom.observe(met_target=True)
    assert headroom.share == pytest.approx(START_SHARE - MISS_COST + MET_GAIN)
    assert (headroom.met, headroom.missed) == (2, 1)


def test_it_never_promises_more_than_the_whole_budget_nor_less_than_its_floor() -> None:
    headroom = Headroom()
    for _ in range(10_000):
        headroom.observe(met_target=True)
    assert headroom.share == SHARE_BOUNDS[1]
    for _ in range(100):
        headroom.observe(met_target=False)
    assert headroom.share == SHARE_BOUNDS[0]


def test_one_miss_in_a_hundred_holds_it_steady_more_lowers_it_fewer_raise_it() -> None:
    def after(misses_per_hundred: int) -> float:
        headroom = Headroom(share=0.6)
        for _ in range(20):
            for index in range(100):
                headroom.observe(met_target=index >= misses_per_hundred)
        return headroom.share

    assert after(1) == pytest.approx(0.6)
    assert after(2) < 0.5  # down at its floor, then back up by the 98 met since the last miss
    assert after(0) == SHARE_BOUNDS[1]


def test_what_outcomes_taught_fades_when_none_come_so_a_burst_after_quiet_is_judged_afresh() -> None:
    now = [0.0]
    headroom = Headroom(clock=lambda: now[0])
    for _ in range(4):
        headroom.observe(met_target=False)  # an overload long past
    assert headroom.share == SHARE_BOUNDS[0]
    now[0] += IDLE_S  # a pause between requests changes nothing
    assert headroom.share == SHARE_BOUNDS[0]
    now[0] += RELAX_S
    assert SHARE_BOUNDS[0] < headroom.share < START_SHARE
    now[0] += 10 * RELAX_S
    assert headroom.share == pytest.approx(START_SHARE, abs=1e-3)


def test_a_cluster_of_misses_cuts_once_since_those_queued_before_the_cut_were_promised_under_it() -> None:
    now = [0.0]
    headroom = Headroom(clock=lambda: now[0])
    now[0] = 10.0
    for _ in range(4):  # queued at 9 s, all missing at 10 s: one lesson
        headroom.observe(met_target=False, queued_at=9.0)
    assert headroom.share == pytest.approx(START_SHARE - MISS_COST)
    assert headroom.missed == 4
    now[0] = 11.0
    headroom.observe(met_target=False, queued_at=10.5)  # queued under the lowered share: it cuts again
    assert headroom.share == pytest.approx(START_SHARE - 2 * MISS_COST)


def test_after_a_cut_only_requests_queued_since_raise_it_again() -> None:
    now = [10.0]
    headroom = Headroom(clock=lambda: now[0])
    headroom.observe(met_target=False, queued_at=9.0)
    for _ in range(100):  # the rest of the queue promised before the cut meets its targets
        headroom.observe(met_target=True, queued_at=9.5)
    assert headroom.share == pytest.approx(START_SHARE - MISS_COST)
    assert headroom.met == 100
    headroom.observe(met_target=True, queued_at=10.5)  # promised under the lowered share
    assert headroom.share == pytest.approx(START_SHARE - MISS_COST + MET_GAIN)
