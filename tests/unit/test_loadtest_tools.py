"""The load-test and benchmark tooling: seeded workloads, the SLO gate's verdicts, bench ratios."""

from __future__ import annotations

from pathlib import Path

import pytest
from loadtest.bench_driver import RequestResult, percentile, summarise
from loadtest.engine_bench import derive
from loadtest.goodput_bench import (
    DEFAULT_PAGE,
    MAKE_TARGETS,
    SIMULATED_PAGE,
    ServerMs,
    admitted_at_risk,
    calibrated_step_ms,
    capacity_drift,
    engine_speeds,
    missed_deadlines,
    queued_prediction_p50,
    queued_wait_p50,
    refusal_p99_server_ms,
)
from loadtest.locust_options import parse_weights
from loadtest.prom import Scrape
from loadtest.slo import evaluate, highest_passing, load_slo, passed, verdict_table
from loadtest.workload import offline_batch, poisson_arrivals, repetitive_text

SUMMARY = {"requests": 1000, "failures": 5, "requests_per_s": 950.0, "p99_ms": 180.0, "failure_ratio": 0.005}


def test_workloads_are_seeded_and_arrive_over_time() -> None:
    assert poisson_arrivals(20, 2.0, seed=3) == poisson_arrivals(20, 2.0, seed=3)
    assert poisson_arrivals(20, 2.0, seed=3) != poisson_arrivals(20, 2.0, seed=4)
    arrivals = [r.arrival_s for r in poisson_arrivals(200, 4.0, seed=0).requests]
    assert arrivals == sorted(arrivals)
    assert 200 / arrivals[-1] == pytest.approx(4.0, rel=0.25)
    lengths = {r.max_tokens for r in poisson_arrivals(50, 2.0, seed=0).requests}
    assert len(lengths) > 10, "output lengths are a distribution, not one value"
    batch = offline_batch(8, 10, 32)
    assert {r.max_tokens for r in batch.requests} == {32}
    assert {r.arrival_s for r in batch.requests} == {0.0}
    assert repetitive_text(4, concurrency=2, max_tokens=8).concurrency == 2


def test_mission_slo_is_the_products_target() -> None:
    mission = load_slo("mission")
    assert (mission.min_requests_per_s, mission.max_p99_ms, mission.max_failure_ratio) == (1000, 200, 0.01)


def test_gate_misses_on_throughput_and_says_by_how_much() -> None:
    checks = evaluate(SUMMARY, load_slo("mission"))
    assert not passed(checks)
    assert [c.passed for c in checks] == [False, True, True]
    table = verdict_table(checks, load_slo("mission"), "test machine")
    assert "VERDICT: MISS" in table
    assert "0.95x of target" in table
    assert "targets set for: 1x NVIDIA H200" in table
    assert "Ran on: test machine" in table


def test_gate_passes_when_every_target_holds_and_flags_override_the_profile() -> None:
    assert passed(evaluate(SUMMARY, load_slo("mission", min_requests_per_s=900)))
    assert not passed(
        evaluate(
            {**SUMMARY, "failure_ratio": 0.02, "failures": 20}, load_slo("mission", min_requests_per_s=1)
        )
    )
    assert not passed(evaluate({**SUMMARY, "p99_ms": None}, load_slo("mission", min_requests_per_s=1)))


def test_unknown_slo_profile_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="unknown SLO profile"):
        load_slo("nope")


def test_sweep_reports_the_highest_load_before_the_first_miss() -> None:
    slo = load_slo("cpu-smollm2")

    def step(p99: float) -> list:  # type: ignore[type-arg]
        return evaluate({**SUMMARY, "p99_ms": p99}, slo, check_throughput=False)

    assert highest_passing([(1, step(100)), (2, step(900)), (4, step(9000)), (8, step(100))]) == 2
    assert highest_passing([(1, step(9000))]) is None


def test_user_weights_parse_and_reject_unknown_classes() -> None:
    assert parse_weights("completion=3,stream=1,chat=0") == {"completion": 3, "stream": 1, "chat": 0}
    with pytest.raises(ValueError, match="unknown user class"):
        parse_weights("completion=1,embeddings=1")
    with pytest.raises(ValueError, match="weight 0"):
        parse_weights("completion=0")


def test_bench_statistics_and_ratios_come_from_the_same_run() -> None:
    results = [RequestResult(True, 0.1 * i, 1.0 * i, 10) for i in range(1, 101)]
    stats = summarise("w", [*results, RequestResult(False, 0, 0.5, 0)], duration_s=10.0)
    assert (stats.requests, stats.failures, stats.output_tokens_per_s) == (101, 1, 100.0)
    assert stats.e2e_p50_s == 50.0
    assert stats.e2e_p99_s == 99.0
    assert percentile([], 50) != percentile([], 50)  # NaN

    def row(mode: str, variant: str, workload: str, tok_s: float, p50: float = 1.0) -> dict:  # type: ignore[type-arg]
        return {"mode": mode, "variant": variant, "workload_key": workload, "output_tokens_per_s": tok_s,
                "e2e_p50_s": p50, "e2e_p99_s": 2 * p50, "ttft_p50_s": p50 / 10}  # fmt: skip

    rows = [row("offline", "baseline", "batch", 100), row("offline", "vllm", "batch", 150),
            row("online", "vllm", "batch", 135, p50=1.02),
            row("offline", "vllm-ngram", "batch", 75)]  # fmt: skip
    derived = derive(rows)
    assert rows[1]["tok_s_vs_baseline"] == 1.5
    assert derived["gateway_overhead"][0]["online_over_offline_tok_s"] == pytest.approx(0.9)
    assert derived["gateway_overhead"][0]["added_p50_ms"] == pytest.approx(20)
    assert derived["speculation"][0]["speedup_tok_s"] == 0.5


def test_the_spec_bench_schedules_the_best_harmless_token_count_else_the_least_harmful() -> None:
    from loadtest.spec_bench import CONCURRENCY, add_ratios, derive_schedule

    # Output tok/s relative to plain (100) per concurrency, for (repetitive, open-ended).
    measured = {
        # Configured but drafting nothing: speculation still turns vLLM's async scheduling off.
        "ngram-k0": dict.fromkeys(CONCURRENCY, (92, 92)),
        "ngram-k2": {1: (190, 105), 2: (180, 100), 4: (120, 99), 8: (99, 97)},
        "ngram-k4": {1: (240, 104), 2: (200, 99), 4: (130, 90), 8: (90, 80)},
        "ngram-k8": {1: (290, 103), 2: (210, 96), 4: (140, 85), 8: (80, 70)},
    }
    rows = []
    for variant, by_concurrency in [("plain", {}), *measured.items()]:
        for concurrency in CONCURRENCY:
            repetitive, open_ended = by_concurrency.get(
                concurrency, (100, 100) if variant == "plain" else (60, 60)
            )
            for workload, tok_s in (("repetitive", repetitive), ("open-ended", open_ended)):
                rows.append(
                    {
                        "variant": variant,
                        "workload": workload,
                        "concurrency": concurrency,
                        "output_tokens_per_s": tok_s,
                        "tpot_p50_s": 0.01,
                        "tpot_p99_s": 0.02,
                    }
                )
    add_ratios(rows)
    # c=1: k8 is fastest and harmless; c=2: k8 costs open-ended text (0.96 < 0.98), k4 wins;
    # c=4: only k2 stays above the line; c=8: none does, k2 costs least (0.97); from c=16 on,
    # drafting nothing costs least (0.92 against 0.60).
    assert derive_schedule(rows) == [[1, 1, 8], [2, 2, 4], [3, 8, 2], [9, 64, 0]]


def test_the_overload_page_says_when_the_machine_s_speed_moved_during_the_run() -> None:
    assert capacity_drift(10.0, None) == ""
    steady = capacity_drift(10.0, 11.0)
    assert "11.0 req/s" in steady
    assert "moved" not in steady
    faster = capacity_drift(7.6, 12.0)
    assert "1.58x the first" in faster
    assert "the machine's speed moved" in faster
    assert "moved" in capacity_drift(10.0, 8.0)


def test_the_overload_page_says_when_the_machine_was_slower_for_one_server_than_another() -> None:
    gauge = "llmserve_admission_predicted_step_seconds"
    llmserve = Scrape.parse(f'{gauge}{{model="m",batch="1"}} 0.0558\n{gauge}{{model="m",batch="64"}} 0.23\n')
    assert calibrated_step_ms(llmserve) == pytest.approx(55.8), "the step with one sequence running"
    assert calibrated_step_ms(Scrape.parse("vllm:num_requests_running 0\n")) is None, "vllm serve has none"
    assert calibrated_step_ms(None) is None
    assert engine_speeds({}) == ""
    steady = engine_speeds({"capacity": 55.8, "llmserve, SLO admission": 58.0})
    assert "capacity 55.8 ms" in steady
    assert "moved" not in steady
    moved = engine_speeds({"capacity": 55.8, "llmserve, no admission": 70.9, "llmserve, SLO admission": 70.7})
    assert "moved between them" in moved, "a quarter slower by the SLO server's loads: not the same 1x"


def test_each_overload_page_tells_the_make_target_that_writes_it() -> None:
    makefile = (Path(__file__).parents[2] / "Makefile").read_text()
    for page, target in MAKE_TARGETS.items():
        recipe = makefile.split(f"\n{target}:", 1)[1].split("\n\n", 1)[0]
        assert "loadtest.goodput_bench" in recipe, target
        # The default page is the one a run without --page writes.
        assert ("--page" in recipe) == (page not in {DEFAULT_PAGE, SIMULATED_PAGE}), page


def test_the_overload_bench_reads_llmserves_histograms_over_each_load_and_nothing_for_vllm_serve() -> None:
    def scrape(refused_fast: int, refused_slow: int, queued_on_time: int) -> Scrape:
        refusals = "llmserve_rejection_latency_seconds_bucket"
        ratios = "llmserve_admission_e2e_prediction_ratio_bucket"
        waits = "llmserve_admission_queue_wait_prediction_ratio_bucket"
        return Scrape.parse(
            f'{refusals}{{when="at_arrival",le="0.01"}} {refused_fast}\n'
            f'{refusals}{{when="at_arrival",le="+Inf"}} {refused_fast}\n'
            f'{refusals}{{when="after_waiting",le="0.01"}} 0\n'
            f'{refusals}{{when="after_waiting",le="+Inf"}} {refused_slow}\n'
            f'{ratios}{{decision="queued",le="0.9"}} 0\n'
            f'{ratios}{{decision="queued",le="1.0"}} {queued_on_time}\n'
            f'{ratios}{{decision="queued",le="+Inf"}} {queued_on_time}\n'
            f'{ratios}{{decision="run_at_once",le="0.9"}} 50\n'
            f'{ratios}{{decision="run_at_once",le="+Inf"}} 50\n'
            f'{waits}{{le="0.25"}} 0\n'
            f'{waits}{{le="0.5"}} {queued_on_time}\n'
            f'{waits}{{le="+Inf"}} {queued_on_time}\n'
        )

    before, after = scrape(5, 0, 0), scrape(105, 0, 20)
    assert refusal_p99_server_ms(before, after) == ServerMs(pytest.approx(9.9))
    assert refusal_p99_server_ms(before, after, when="at_arrival") == ServerMs(pytest.approx(9.9))
    assert queued_prediction_p50(before, after) == pytest.approx(0.95), "the queued only, this load only"
    assert queued_wait_p50(before, after) == pytest.approx(0.375), "their wait over the queue's forecast"
    vllm = Scrape.parse("vllm:num_requests_running 0\n")
    assert refusal_p99_server_ms(vllm, vllm) is None
    assert queued_prediction_p50(vllm, vllm) is None
    assert queued_prediction_p50(None, after) is None
    assert queued_wait_p50(vllm, vllm) is None


def test_a_refusal_p99_past_the_histograms_last_edge_is_printed_as_at_least_that_edge() -> None:
    refusals = "llmserve_rejection_latency_seconds_bucket"

    def scrape(within_a_second: int, past_two_minutes: int) -> Scrape:
        return Scrape.parse(
            f'{refusals}{{when="at_arrival",le="1.0"}} {within_a_second}\n'
            f'{refusals}{{when="at_arrival",le="120.0"}} {within_a_second}\n'
            f'{refusals}{{when="at_arrival",le="+Inf"}} {within_a_second + past_two_minutes}\n'
        )

    p99 = refusal_p99_server_ms(scrape(0, 0), scrape(90, 10))
    assert p99 == ServerMs(120_000.0, at_least=True)
    assert p99.cell() == "≥120000", "not a figure the histogram cannot know"
    assert refusal_p99_server_ms(scrape(0, 0), scrape(100, 0)) == ServerMs(pytest.approx(990.0))
    assert ServerMs(990.0).cell() == "990.0"


def test_the_overload_bench_counts_late_answers_by_how_admission_let_them_in() -> None:
    def scrape(at_once_met: int, at_once_missed: int, queued_missed: int, best_effort: int) -> Scrape:
        outcomes = "llmserve_admission_deadline_outcomes_total"
        return Scrape.parse(
            f'{outcomes}{{decision="run_at_once",outcome="met"}} {at_once_met}\n'
            f'{outcomes}{{decision="run_at_once",outcome="missed"}} {at_once_missed}\n'
            f'{outcomes}{{decision="run_at_once",outcome="best_effort"}} {best_effort}\n'
            f'{outcomes}{{decision="queued",outcome="met"}} 0\n'
            f'{outcomes}{{decision="queued",outcome="missed"}} {queued_missed}\n'
            f'{outcomes}{{decision="queued",outcome="best_effort"}} 1\n'
        )

    assert missed_deadlines(scrape(10, 1, 2, 0), scrape(60, 4, 9, 5)) == (3, 7, 5), "this load only"
    assert missed_deadlines(scrape(10, 1, 2, 0), scrape(10, 1, 2, 0)) is None, "none admitted"
    vllm = Scrape.parse("vllm:num_requests_running 0\n")
    assert missed_deadlines(vllm, vllm) is None


def test_the_overload_bench_counts_queued_requests_admitted_on_the_late_answer_budget() -> None:
    def scrape(met: int, missed: int) -> Scrape:
        at_risk = "llmserve_admission_admitted_at_risk_total"
        return Scrape.parse(f'{at_risk}{{outcome="met"}} {met}\n{at_risk}{{outcome="missed"}} {missed}\n')

    assert admitted_at_risk(scrape(3, 1), scrape(8, 2)) == (6, 1), "admitted, late: this load only"
    vllm = Scrape.parse("vllm:num_requests_running 0\n")
    assert admitted_at_risk(vllm, vllm) is None
