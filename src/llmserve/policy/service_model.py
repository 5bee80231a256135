"""How long the engine takes, learned from the tokens the server relays: never "no estimate".

A continuous-batching engine advances every running sequence by one token per step, so a
request's time is its prefill plus its tokens times the step time at the batch it shares:

    step(b)    = base + per_sequence * b     seconds per step with b sequences running
    prefill(p) = per_prompt_token * p        seconds to take a prompt of p tokens in
    tokens(m)  = ceil(m * share)             tokens a request with max_tokens m really generates

Each relayed delta is a sample of step(b) (its gap over the tokens it carries, at the batch
running then; under load a step also carries other requests' prefill chunks, so the line
learns the step time requests really see). The line is a weighted least-squares fit over
recent samples (older ones fade: the model follows the machine and the traffic of the last
seconds) anchored at the step time of a sequence running alone, which calibration measures
before the server reports ready (serving/calibration.py) and light traffic keeps current; so
an idle period changes nothing and a burst after it meets a real estimate. Each first token is
a sample of prefill; each finished request, of share.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

# Until measured: roughly a small model on two CPU cores. Calibration replaces these at start-up.
PRIOR_BASE_S = 0.05
PRIOR_PER_SEQUENCE_S = 0.002
PRIOR_PER_PROMPT_TOKEN_S = 0.0005
SMOOTHING = 0.2  # weight of a new sample in an average
FORGETTING = 0.999  # per step sample: the fit remembers the last few thousand samples
ANCHOR_WEIGHT = 50.0  # the step time alone counts as this many recent samples
ALONE = 2  # batches up to this size measure the step time alone
LIGHT_LOAD = 8  # batches up to this size measure a prompt's own prefill cost
# A step that finished more than this many times the prompt tokens steps usually do (at least
# USUAL_PREFILL_FLOOR) is a burst's transient, the prompts of a crowd arriving at once: its cost
# is in those requests' own prefill term, not in the step time every later step will see.
PREFILL_HEAVY = 4.0
USUAL_PREFILL_FLOOR = 64
PREFILL_SMOOTHING = 0.05
SHARE_WINDOW = 200  # finished requests that estimate the share of max_tokens used
SHARE_QUANTILE = 0.9
# Predictions are checked against what finished requests really took: the median of actual /
# predicted over recent requests scales every prediction (within these bounds), so predictions
# are unbiased; the margin for the tail is the queue's headroom (policy/headroom.py), steered by
# outcomes. (A 90th percentile here stacked a margin on every term: at 64 running it predicted
# 1.7x the real step, refused every request longer than typical and queued none of a burst.)
CORRECTION_WINDOW = 200
CORRECTION_QUANTILE = 0.5
CORRECTION_BOUNDS = (0.5, 3.0)


@dataclass
class _Average:
    value: float
    samples: int = 1

    def add(self, sample: float) -> None:
        weight = max(SMOOTHING, 1 / (self.samples + 1))
        self.value += weight * (sample - self.value)
        self.samples += 1


class ServiceModel:
    def __init__(self) -> None:
        self._alone: _Average | None = None
        self._weight = self._sum_b = self._sum_s = self._sum_bb = self._sum_bs = 0.0
        self._prefill_per_token = _Average(PRIOR_PER_PROMPT_TOKEN_S, samples=0)
        self._shares: deque[float] = deque(maxlen=SHARE_WINDOW)
        self._share_quantile: float | None = None
        self._errors: deque[float] = deque(maxlen=CORRECTION_WINDOW)
        self._base, self._per_sequence = PRIOR_BASE_S, PRIOR_PER_SEQUENCE_S
        self._usual_step_prefill = 0.0
        self._fitted = True  # observations arrive per token, reads per request: fit on read
        self.correction = 1.0

    def observe_step(self, batch: int, seconds: float) -> None:
        if batch < 1 or not 0 < seconds < 60:
            return
        if batch <= ALONE:
            if self._alone is None:
                self._alone = _Average(seconds)
            else:
                self._alone.add(seconds)
        self._weight = self._weight * FORGETTING + 1
        self._sum_b = self._sum_b * FORGETTING + batch
        self._sum_s = self._sum_s * FORGETTING + seconds
        self._sum_bb = self._sum_bb * FORGETTING + batch * batch
        self._sum_bs = self._sum_bs * FORGETTING + batch * seconds
        self._fitted = False

    def observe_engine_step(self, batch: int, seconds: float, prompt_tokens: int) -> None:
        """A step timed by the engine, which also finished the prefill of `prompt_tokens`."""
        usual = max(USUAL_PREFILL_FLOOR, self._usual_step_prefill)
        self._usual_step_prefill += PREFILL_SMOOTHING * (prompt_tokens - self._usual_step_prefill)
        if prompt_tokens <= PREFILL_HEAVY * usual:
            self.observe_step(batch, seconds)

    def observe_prefill(self, prompt_tokens: int, seconds: float, batch: int) -> None:
        """`seconds` from admission to the first token, which also waited for one step at `batch`.

        Only light load measures a prompt's own cost: under load the first token also waits for
        the steps in progress, and other requests' prefill is in the step samples already."""
        if prompt_tokens < 1 or batch > LIGHT_LOAD:
            return
        self._prefill_per_token.add(max(0.0, seconds - self.step_s(batch)) / prompt_tokens)

    def observe_finish(self, generated_tokens: int, max_tokens: int) -> None:
        if max_tokens > 0:
            self._shares.append(min(1.0, generated_tokens / max_tokens))
            self._share_quantile = None

    def observe_service(self, predicted_s: float, actual_s: float) -> None:
        """A finished request: how long admission predicted it would take, and how long it took."""
        if predicted_s <= 0 or actual_s <= 0:
            return
        self._errors.append(actual_s / predicted_s)
        if len(self._errors) >= 10:
            ratio = _quantile(self._errors, CORRECTION_QUANTILE)
            self.correction = min(max(ratio, CORRECTION_BOUNDS[0]), CORRECTION_BOUNDS[1])

    def step_s(self, batch: int) -> float:
        """One step at `batch`, as requests see it (corrected by what they really took)."""
        if not self._fitted:
            self._fit()
        return (self._base + self._per_sequence * max(1, batch)) * self.correction

    def prefill_s(self, prompt_tokens: int) -> float:
        return self._prefill_per_token.value * prompt_tokens * self.correction

    def expected_tokens(self, max_tokens: int) -> int:
        """What a request is likely to generate: a high quantile of the share of max_tokens used."""
        if len(self._shares) < 10:
            return max_tokens
        if self._share_quantile is None:  # sorted once per finished request, not per arrival
            self._share_quantile = _quantile(self._shares, SHARE_QUANTILE)
        share = self._share_quantile
        return max(1, min(max_tokens, math.ceil(max_tokens * share)))

    def service_s(self, prompt_tokens: int, tokens: int, batch: int) -> float:
        """A request's time in the engine: its prefill, then `tokens` steps at `batch`."""
        return self.prefill_s(prompt_tokens) + tokens * self.step_s(batch)

    def _fit(self) -> None:
        """Weighted least squares over the recent samples and the anchor (alone, at batch 1)."""
        weight, sum_b, sum_s, sum_bb, sum_bs = (
            self._weight,
            self._sum_b,
            self._sum_s,
            self._sum_bb,
            self._sum_bs,
        )
        if self._alone is not None:
            weight += ANCHOR_WEIGHT
            sum_b += ANCHOR_WEIGHT
            sum_s += ANCHOR_WEIGHT * self._alone.value
            sum_bb += ANCHOR_WEIGHT
            sum_bs += ANCHOR_WEIGHT * self._alone.value
        mean_b, mean_s = sum_b / weight, sum_s / weight
        spread = sum_bb / weight - mean_b**2
        if spread > 1e-6:
            self._per_sequence = max(0.0, (sum_bs / weight - mean_b * mean_s) / spread)
        self._base = max(1e-4, mean_s - self._per_sequence * mean_b)
        self._fitted = True

    def describe(self) -> str:
        if not self._fitted:
            self._fit()
        return (
            f"step {self._base * 1000:.1f} ms + {self._per_sequence * 1000:.2f} ms per running sequence, "
            f"prefill {self._prefill_per_token.value * 1e6:.0f} µs per prompt token, "
            f"correction x{self.correction:.2f}"
        )


def _quantile(values: deque[float], quantile: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(quantile * len(ordered)))]
