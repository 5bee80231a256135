"""How long the engine takes, learned from the tokens the server relays: never "no estimate".

A continuous-batching engine advances every running sequence by one token per step, and takes
in the prompts of newly admitted requests in the same steps, so a request's time is its prefill
plus its tokens times the step time at the batch it shares:

    step(b)    = base + per_sequence * b + per_step_prompt_token * q(b)
                 seconds per step with b sequences running, where q(b) is the prompt tokens a
                 step takes in: b * P / T with a batch of b turning over (each step, b / T of
                 its typical requests of P prompt tokens and T tokens finish and as many new
                 ones start: Little's law), or what steps took in lately if that is more
    prefill(p) = per_prompt_token * p        seconds to take a prompt of p tokens in
                 (where the engine times its steps: per_step_prompt_token, the plane's own
                 marginal cost of a prompt token in a step)
    tokens(m)  = ceil(m * share)             tokens a request with max_tokens m really generates

vLLM times each step itself (engine/step_stats.py): a sample of (b, prompt tokens it finished,
seconds); other engines give the gap of each relayed delta over the tokens it carries, at the
batch running then (no prompt count: those steps learn a line in b alone). The plane is a
weighted least-squares fit over recent samples (older ones fade: the model follows the machine
and the traffic of the last seconds) anchored at the step time of a sequence running alone,
which calibration measures before the server reports ready (serving/calibration.py) and light
traffic keeps current; so an idle period changes nothing and a burst after it meets a real
estimate. A burst's prompts make a few steps long; the prompt term explains them, rather than
every later step being predicted as long; the turnover's share is counted from the start of a
load (a running average of recent steps lagged it by 20-40 % after an idle spell or a drain).
Each first token is a sample of prefill; each
finished request, of share. Where the engine times its steps, first tokens teach nothing about
prefill: a first token under light load also waits for every other prompt its step takes in (after
an idle spell, a burst's: 10 ms a prompt token learned against a real 0.8 ms).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
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
PREFILL_SMOOTHING = 0.05  # per engine step: the prompt tokens steps usually take in
# Below this spread of prompt tokens over the samples the plane is not determined in that
# direction: the prompt term keeps its last value and the line in b is fitted alone.
MIN_PROMPT_SPREAD = 1.0
SHARE_WINDOW = 200  # finished requests that estimate the share of max_tokens used
SHARE_QUANTILE = 0.9
# Predictions are checked against what finished requests really took: the median of actual /
# predicted over recent requests scales every prediction (within these bounds), so predictions
# are unbiased; the margin for the tail is the queue's headroom (policy/headroom.py), steered by
# outcomes, and `tail`, what a request that waits plans on. (A 90th percentile here stacked a
# margin on every term: at 64 running it predicted 1.7x the real step, refused every request
# longer than typical and queued none of a burst.)
CORRECTION_WINDOW = 200
CORRECTION_QUANTILE = 0.5
CORRECTION_BOUNDS = (0.5, 3.0)
TAIL_QUANTILE = 0.9  # of actual / predicted, over its median: the spread a queued request plans on
# A request's tail is measured among those of about its length (within this factor of its tokens,
# either way), where at least TAIL_MIN_SAMPLES of the window are: a long request averages its
# steps' noise over more of them (on the CPU engine in float32 at 1x, the 90th percentile over the
# median was 1.26 for 12-23 tokens and 1.08 for 36-48, 1.19 over all). Planned on the spread of
# all, long requests were the ones refused at the door at 1x while the engine served them in time.
TAIL_NEIGHBOURHOOD = 1.5
TAIL_MIN_SAMPLES = 20
TAIL_REFRESH = 10  # finished requests between fresh looks at the tails by length


@dataclass(frozen=True)
class BatchLine:
    """The service model at one batch (`ServiceModel.at`)."""

    step_s: float  # a step that takes in no prompt
    per_step_prompt_token_s: float  # what a step takes longer per prompt token it takes in
    step_prompt_tokens: float  # what a step is planned to take in, at most
    prefill_per_token_s: float  # a request's own prompt, per token

    def service_s(self, prompt_tokens: int, tokens: int, inflow: float | None = None) -> float:
        """`ServiceModel.service_s` at this batch."""
        taken = self.step_prompt_tokens if inflow is None else min(self.step_prompt_tokens, inflow)
        step_s = self.step_s + self.per_step_prompt_token_s * taken
        return self.prefill_per_token_s * prompt_tokens + tokens * step_s


class TypicalRequest:
    """A running average of the requests arriving: the size the batch limit is planned for and
    what a turning-over batch takes in."""

    def __init__(self) -> None:
        self._prompt_tokens = 0.0
        self._tokens = 0.0
        self._seen = 0

    def observe(self, prompt_tokens: int, tokens: int) -> None:
        weight = max(0.05, 1 / (self._seen + 1))
        self._prompt_tokens += weight * (prompt_tokens - self._prompt_tokens)
        self._tokens += weight * (tokens - self._tokens)
        self._seen += 1

    @property
    def seen(self) -> int:
        return self._seen

    @property
    def prompt_tokens(self) -> int:
        return round(self._prompt_tokens)

    @property
    def tokens(self) -> int:
        return max(1, round(self._tokens))

    def prompt_tokens_per_step(self, batch: int) -> float:
        """Prompt tokens per step of a batch of `batch` such requests, turning over."""
        return batch * self._prompt_tokens / max(1.0, self._tokens) if self._seen else 0.0


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
        self._sums = _PlaneSums()
        self._prefill_per_token = _Average(PRIOR_PER_PROMPT_TOKEN_S, samples=0)
        self._shares: deque[float] = deque(maxlen=SHARE_WINDOW)
        self._share_quantile: float | None = None
        # (tokens planned, actual / predicted) of the latest finished requests
        self._errors: deque[tuple[int, float]] = deque(maxlen=CORRECTION_WINDOW)
        self._tails: dict[int, float] = {}  # by tokens, until TAIL_REFRESH more have finished
        self._finished_since_tails = 0
        self._median_error = 0.0  # of actual / predicted, unbounded (the correction is bounded)
        self._base, self._per_sequence = PRIOR_BASE_S, PRIOR_PER_SEQUENCE_S
        self._per_step_prompt_token = 0.0
        self._usual_step_prompt_tokens = 0.0
        self._fitted = True  # observations arrive per token, reads per request: fit on read
        self.engine_times_steps = False  # once it has: step samples carry their prompt tokens
        self.correction = 1.0
        self.tail = 1.0  # a slow request's time over a typical one's, at the same prediction
        self.typical = TypicalRequest()
        self._changes = 0  # of what step_s, prefill_s and typical_service_s predict
        self._typical_service: dict[int, float] = {}  # per batch, at `_typical_service_revision`
        self._typical_service_revision = self.revision

    @property
    def revision(self) -> tuple[int, int]:
        """Changes whenever what `step_s`, `prefill_s` or `typical_service_s` predict may change:
        what was computed from them at one revision holds until the next."""
        return self._changes, self.typical.seen

    def observe_step(self, batch: int, seconds: float) -> None:
        """A step measured between relayed tokens (the prompts it took in are not known). Where the
        engine times its steps, only its clock teaches them: a relayed gap also holds the API
        process's own work (at a batch of 48 on the CPU, 1.5x the engine's step), and every
        request relays one, so they outnumbered the engine's samples by the batch."""
        if not self.engine_times_steps:
            self._observe(batch, 0, seconds)

    def observe_engine_step(self, batch: int, seconds: float, prompt_tokens: int) -> None:
        """A step timed by the engine, which also finished the prefill of `prompt_tokens`."""
        self.engine_times_steps = True
        self._usual_step_prompt_tokens += PREFILL_SMOOTHING * (prompt_tokens - self._usual_step_prompt_tokens)
        self._changes += 1
        self._observe(batch, prompt_tokens, seconds)

    def _observe(self, batch: int, prompt_tokens: int, seconds: float) -> None:
        if batch < 1 or not 0 < seconds < 60:
            return
        if batch <= ALONE and prompt_tokens == 0:
            if self._alone is None:
                self._alone = _Average(seconds)
            else:
                self._alone.add(seconds)
        self._sums.add(batch, prompt_tokens, seconds, FORGETTING)
        self._fitted = False
        self._changes += 1

    def observe_prefill(self, prompt_tokens: int, seconds: float, batch: int) -> None:
        """`seconds` from admission to the first token, which also waited for one step at `batch`.

        Only light load measures a prompt's own cost: under load the first token also waits for
        the steps in progress, and other requests' prefill is in the step samples already."""
        if prompt_tokens < 1 or batch > LIGHT_LOAD or self.engine_times_steps:
            return
        self._prefill_per_token.add(max(0.0, seconds - self.step_s(batch)) / prompt_tokens)
        self._changes += 1

    def observe_finish(self, generated_tokens: int, max_tokens: int) -> None:
        if max_tokens > 0:
            self._shares.append(min(1.0, generated_tokens / max_tokens))
            self._share_quantile = None

    def observe_service(self, predicted_s: float, actual_s: float, tokens: int) -> None:
        """A finished request: how long the fit predicted it would take (uncorrected), how long it
        took, and the tokens it was planned to generate."""
        if predicted_s <= 0 or actual_s <= 0:
            return
        self._errors.append((tokens, actual_s / predicted_s))
        self._finished_since_tails += 1
        if self._finished_since_tails >= TAIL_REFRESH:
            self._tails.clear()
            self._finished_since_tails = 0
        if len(self._errors) >= 10:
            ordered = sorted(ratio for _, ratio in self._errors)  # once, for both quantiles
            ratio = self._median_error = _quantile_of_sorted(ordered, CORRECTION_QUANTILE)
            self.tail = _tail(ordered, ratio)
            correction = min(max(ratio, CORRECTION_BOUNDS[0]), CORRECTION_BOUNDS[1])
            if correction != self.correction:
                self.correction = correction
                self._changes += 1

    def tail_for(self, tokens: int) -> float:
        """The tail a request of `tokens` tokens plans on: the 90th percentile of actual / predicted
        among the recent requests of about its length, over the median of all (the correction it
        is scaled by); `tail` where too few of them have finished. Kept for TAIL_REFRESH finished
        requests: a queue asks it for every waiter it looks at."""
        tail = self._tails.get(tokens)
        if tail is None:
            low, high = tokens / TAIL_NEIGHBOURHOOD, tokens * TAIL_NEIGHBOURHOOD
            near = sorted(ratio for length, ratio in self._errors if low <= length <= high)
            tail = self.tail
            if len(near) >= TAIL_MIN_SAMPLES and self._median_error > 0:
                tail = _tail(near, self._median_error)
            self._tails[tokens] = tail
        return tail

    def step_s(self, batch: int, corrected: bool = True, inflow: float | None = None) -> float:
        """One step at `batch`, as requests see it (corrected by what they really took).
        `inflow`: the prompt tokens a step can take in at most, where fewer are coming than a
        batch turning over takes (the queue and the arrivals run dry: a burst's drain)."""
        return self.step_with_prompts_s(batch, self.step_prompt_tokens(batch, inflow), corrected)

    def step_prompt_tokens(self, batch: int, inflow: float | None = None) -> float:
        """The prompt tokens `step_s` plans a step at `batch` to take in."""
        turning_over = self.typical.prompt_tokens_per_step(max(1, batch))
        prompt_tokens = max(self._usual_step_prompt_tokens, turning_over)
        return prompt_tokens if inflow is None else min(prompt_tokens, inflow)

    def step_with_prompts_s(self, batch: int, prompt_tokens: float, corrected: bool = True) -> float:
        """One step at `batch` that takes in `prompt_tokens`."""
        if not self._fitted:
            self._fit()
        prompt_s = self._per_step_prompt_token * prompt_tokens
        return (self._base + self._per_sequence * max(1, batch) + prompt_s) * self._factor(corrected)

    def prefill_s(self, prompt_tokens: int, corrected: bool = True) -> float:
        return self._prefill_per_token_s() * prompt_tokens * self._factor(corrected)

    def _prefill_per_token_s(self) -> float:
        """A prompt token's prefill: the fit's per step prompt token where the engine times its
        steps, else what light load measured."""
        if not self._fitted:
            self._fit()
        return self._per_step_prompt_token if self.engine_times_steps else self._prefill_per_token.value

    def _factor(self, corrected: bool) -> float:
        return self.correction if corrected else 1.0

    def expected_tokens(self, max_tokens: int) -> int:
        """What a request is likely to generate: a high quantile of the share of max_tokens used."""
        if len(self._shares) < 10:
            return max_tokens
        if self._share_quantile is None:  # sorted once per finished request, not per arrival
            self._share_quantile = _quantile(self._shares, SHARE_QUANTILE)
        share = self._share_quantile
        return max(1, min(max_tokens, math.ceil(max_tokens * share)))

    def service_s(
        self, prompt_tokens: int, tokens: int, batch: int, corrected: bool = True, inflow: float | None = None
    ) -> float:
        """A request's time in the engine: its prefill, then `tokens` steps at `batch` (taking in
        at most `inflow` prompt tokens each: see `step_s`).
        `corrected=False`: as the fit alone predicts it, what `observe_service` is to be given
        (against a corrected prediction the correction would learn its own error back: it swung
        between 0.5 and 2.3 under steady load, halving and doubling every prediction)."""
        return self.at(batch, corrected).service_s(prompt_tokens, tokens, inflow)

    def at(self, batch: int, corrected: bool = True) -> BatchLine:
        """What the model predicts at `batch`, taken once for many requests: the forecast of a
        queue asks it for every request queued, and asked afresh for each, its arithmetic was
        most of a refusal's time (1.1 ms with 128 queued)."""
        if not self._fitted:
            self._fit()
        prefill_per_token_s = self._prefill_per_token_s()
        factor = self._factor(corrected)
        return BatchLine(
            step_s=(self._base + self._per_sequence * max(1, batch)) * factor,
            per_step_prompt_token_s=self._per_step_prompt_token * factor,
            step_prompt_tokens=self.step_prompt_tokens(batch),
            prefill_per_token_s=prefill_per_token_s * factor,
        )

    def typical_service_s(self, batch: int) -> float:
        """`service_s` of a typical request of the current traffic at `batch`. Kept per batch until
        the model changes: admission asks it for many batches per request (the batch limit's
        bisection, the batch arrivals keep running), and computed afresh each time it was ~6 % of
        the API process's time at 4x overload on the simulated H200."""
        revision = self.revision
        if revision != self._typical_service_revision:
            self._typical_service.clear()
            self._typical_service_revision = revision
        seconds = self._typical_service.get(batch)
        if seconds is None:
            seconds = self._typical_service[batch] = self.service_s(
                self.typical.prompt_tokens, self.typical.tokens, batch
            )
        return seconds

    def _fit(self) -> None:
        """Weighted least squares over the recent samples and the anchor (alone: batch 1, no
        prompt), for base, per_sequence and per_step_prompt_token, none of them negative."""
        sums = self._sums.copy()
        if self._alone is not None:
            sums.add(1, 0, self._alone.value, weight=ANCHOR_WEIGHT)
        if sums.weight <= 0:
            self._fitted = True
            return
        mean_b, mean_q, mean_s = sums.b / sums.weight, sums.q / sums.weight, sums.s / sums.weight
        var_b = sums.bb / sums.weight - mean_b**2
        var_q = sums.qq / sums.weight - mean_q**2
        cov_bq = sums.bq / sums.weight - mean_b * mean_q
        cov_bs = sums.bs / sums.weight - mean_b * mean_s
        cov_qs = sums.qs / sums.weight - mean_q * mean_s
        per_sequence, per_prompt_token = self._per_sequence, self._per_step_prompt_token
        determinant = var_b * var_q - cov_bq**2
        if var_q <= MIN_PROMPT_SPREAD or determinant <= 1e-9 * var_b * var_q:
            # The prompt direction is not determined: keep its term, fit the line in b.
            if var_b > 1e-6:
                per_sequence = (cov_bs - per_prompt_token * cov_bq) / var_b
        else:
            per_sequence = (cov_bs * var_q - cov_qs * cov_bq) / determinant
            per_prompt_token = (cov_qs * var_b - cov_bs * cov_bq) / determinant
            # A negative slope is noise: pin it at 0 and fit the other direction alone.
            if per_prompt_token < 0:
                per_prompt_token = 0.0
                per_sequence = cov_bs / var_b if var_b > 1e-6 else self._per_sequence
            elif per_sequence < 0:
                per_sequence = 0.0
                per_prompt_token = max(0.0, cov_qs / var_q)
        per_sequence = max(0.0, per_sequence)
        self._per_sequence, self._per_step_prompt_token = per_sequence, per_prompt_token
        self._base = max(1e-4, mean_s - per_sequence * mean_b - per_prompt_token * mean_q)
        self._fitted = True

    def describe(self) -> str:
        if not self._fitted:
            self._fit()
        return (
            f"step {self._base * 1000:.1f} ms + {self._per_sequence * 1000:.2f} ms per running sequence "
            f"+ {self._per_step_prompt_token * 1e6:.0f} µs per prompt token it takes in "
            f"(usually {self._usual_step_prompt_tokens:.0f}), "
            f"prefill {self.prefill_s(1, corrected=False) * 1e6:.0f} µs per prompt token, "
            f"correction x{self.correction:.2f}"
        )


@dataclass
class _PlaneSums:
    """Weighted sums of the samples (b, q, s) that a least-squares plane s = f(b, q) needs."""

    weight: float = 0.0
    b: float = 0.0
    q: float = 0.0
    s: float = 0.0
    bb: float = 0.0
    qq: float = 0.0
    bq: float = 0.0
    bs: float = 0.0
    qs: float = 0.0

    def add(self, b: float, q: float, s: float, forgetting: float = 1.0, weight: float = 1.0) -> None:
        self.weight = self.weight * forgetting + weight
        self.b = self.b * forgetting + weight * b
        self.q = self.q * forgetting + weight * q
        self.s = self.s * forgetting + weight * s
        self.bb = self.bb * forgetting + weight * b * b
        self.qq = self.qq * forgetting + weight * q * q
        self.bq = self.bq * forgetting + weight * b * q
        self.bs = self.bs * forgetting + weight * b * s
        self.qs = self.qs * forgetting + weight * q * s

    def copy(self) -> _PlaneSums:
        return _PlaneSums(**vars(self))


def _tail(ordered: list[float], median: float) -> float:
    """The spread of sorted ratios of actual / predicted over the median: their TAIL_QUANTILE over
    it, never below 1."""
    return max(1.0, _quantile_of_sorted(ordered, TAIL_QUANTILE) / median)


def _quantile(values: Iterable[float], quantile: float) -> float:
    return _quantile_of_sorted(sorted(values), quantile)


def _quantile_of_sorted(ordered: list[float], quantile: float) -> float:
    return ordered[min(len(ordered) - 1, int(quantile * len(ordered)))]
