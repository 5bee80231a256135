"""vLLM's per-step statistics reach admission as step times by the engine core's own clock."""

from __future__ import annotations

from vllm.v1.metrics.stats import IterationStats, SchedulerStats

from llmserve.engine.step_stats import StepTimes


def test_each_step_delivers_the_median_inter_token_latency_the_engine_batch_and_its_prefill() -> None:
    times, steps = StepTimes(), []
    logger = times.stat_logger_factory()(None, 0)  # type: ignore[arg-type]  # the config is unused
    stats = IterationStats()
    stats.inter_token_latencies_iter = [0.10, 0.12, 0.90]  # one request was preempted for a while
    logger.record(SchedulerStats(num_running_reqs=3), stats)  # nobody listens yet
    times.listener = lambda seconds, running, prompt_tokens: steps.append((seconds, running, prompt_tokens))
    logger.record(SchedulerStats(num_running_reqs=3), stats)
    # With several API processes vLLM sends the scheduler's statistics to one of them.
    logger.record(None, stats)
    logger.record(SchedulerStats(num_running_reqs=3), IterationStats())  # no decode this step
    logger.record(SchedulerStats(num_running_reqs=3), None)
    assert steps == [(0.12, 3, 0), (0.12, None, 0)]
