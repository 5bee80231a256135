"""The margin a promise of time keeps for the tail: how late recent promises came true.

Admission promises a queued request it will be admitted and then finish by its deadline (without
an e2e deadline: be admitted within its wait budget). Predictions are unbiased (the service
model's correction is a median), and the SLO is a 99th percentile, so a promise is made only with
a margin to spare: the 99th percentile of (what happened - what was predicted), in seconds, over
the last WINDOW promises that came due. A queued request refused after waiting counts as late by
at least what was then predicted.

Seconds, not a share of the time a request has: on the CPU engine at 1.5-4x overload the errors of
queued requests had a 99th percentile of +1.2 s whatever that time was (0.6 to 6.7 s). A share of
it, steered up per promise kept and down a fifth per promise broken, gave short requests more
margin than they needed and long ones less, and swung between 55 % and 100 %: 16 of 769 queued
requests were refused after waiting, seconds late; with that 1.2 s to spare at the door, 15 of
the 16 would have been refused there at once.

Until MIN_SAMPLES promises have come due, the margin is PRIOR_SHARE of the horizon (the e2e target,
else the TTFT target, else the queue deadline), or more if one already came due later; it never
exceeds CEILING_SHARE of the horizon, so that two outliers cannot shut the door. What promises
taught is forgotten after MAX_AGE_S: a burst after a quiet spell is not judged by an overload long
past (under 3-4x overload the API process, refusing hundreds of requests a second on two cores
beside the engine, slowed the steps it predicted; the margin reached 3 s).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

QUANTILE = 0.99  # the SLO's percentile
WINDOW = 200  # promises: at overload on the CPU engine, the last ~15 s; at GPU rates, a fraction of one
MIN_SAMPLES = 20
PRIOR_SHARE = 0.1
CEILING_SHARE = 0.5
MAX_AGE_S = 20.0


class TailMargin:
    def __init__(
        self, horizon_s: float, prior_share: float = PRIOR_SHARE, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._prior_s = prior_share * horizon_s
        self._ceiling_s = CEILING_SHARE * horizon_s
        self._clock = clock
        self._errors: deque[tuple[float, float]] = deque(maxlen=WINDOW)  # (when, seconds late)
        self._seconds: float | None = self._prior_s
        self.kept = 0
        self.broken = 0

    def observe(self, promised_at: float, happened_at: float) -> None:
        """A promise came due: what it promised would happen by `promised_at` happened (or, for a
        request refused after waiting, was predicted to happen) at `happened_at`."""
        error = happened_at - promised_at
        self._errors.append((self._clock(), error))
        if error <= 0:
            self.kept += 1
        else:
            self.broken += 1
        self._seconds = None

    @property
    def seconds(self) -> float:
        """Seconds a promise keeps to spare: read per arrival, computed once per outcome (and
        again once the oldest is forgotten)."""
        forget_before = self._clock() - MAX_AGE_S
        while self._errors and self._errors[0][0] < forget_before:
            self._errors.popleft()
            self._seconds = None
        if self._seconds is None:
            errors = [error for _, error in self._errors]
            if len(errors) < MIN_SAMPLES:
                tail = max([self._prior_s, *errors])
            else:
                ordered = sorted(errors)
                tail = ordered[min(len(ordered) - 1, int(QUANTILE * len(ordered)))]
            self._seconds = min(self._ceiling_s, max(0.0, tail))
        return self._seconds
