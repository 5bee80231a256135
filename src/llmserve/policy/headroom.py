"""How much of its wait budget a queued request may be promised, steered by those that waited.

A request that cannot run at once is queued only if its predicted wait is at most `share` of the
time it has (its latency target less its predicted service; without targets, queue_timeout_s).
Predictions err both ways and the SLO is a 99th percentile, so the share is steered by outcomes,
as a congestion window is: each queued request that met its target raises it a little, each that
missed (finished after its deadline, or refused after waiting) lowers it MISS_COST. At equilibrium
TARGET_MISS_SHARE of the queued requests miss, and the queue takes as much as that allows: more
when predictions are pessimistic (fewer false refusals), less when they are optimistic (fewer
late answers and slow refusals). Never more than the whole budget.

A miss lowers the share once per cut, as TCP halves its window once per round trip: a request
queued before the last cut was promised its place under the share that cut already lowered, so
its miss says nothing new. (Misses come in clusters, when a burst's prompts lengthen the steps
for every request queued behind them: counted one by one, four misses within a second took the
share from 0.8 to its floor, and the engine then ran half full while the queue refused.) Nor does
its success raise the share again, as TCP in fast recovery grows its window only once the data
sent after the cut is acknowledged: the queue behind a cut met its targets, and those met at
+0.2 % each undid a cut within 8 s, while the load ramp that caused it still ran and the next
promises at the old share came true late.

What outcomes taught fades when none come: after IDLE_S without one, the share returns toward
where it starts (time constant RELAX_S), so a burst after a quiet spell is not judged by the
misses of an overload long past.

It starts at the whole budget: until a miss says otherwise the predictions are taken at their
word. Started at 0.8, a burst after idleness (nothing yet to learn from) kept a fifth of every
queued request's budget unused: in a burst of 250 on the real CPU engine (e2e target 6.5 s) the
admitted finished by 4.9 s at p99 and 79 were answered in time, fewer than `vllm serve` did
unthrottled (94); started at 1.0, 119 in time with a p99 of 6.2 s (2 refused after waiting).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

TARGET_MISS_SHARE = 0.01  # the SLO's percentile: 99 in 100 queued requests meet it
START_SHARE = 1.0  # the whole budget, until a miss says otherwise
SHARE_BOUNDS = (0.3, 1.0)
MISS_COST = 0.2
# Balances MISS_COST at the target: (1 - p) * gain = p * cost.
MET_GAIN = MISS_COST * TARGET_MISS_SHARE / (1 - TARGET_MISS_SHARE)
IDLE_S = 5.0
RELAX_S = 30.0


class Headroom:
    def __init__(self, share: float = START_SHARE, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._learned = share
        self._learned_at = clock()
        self._cut_at = -math.inf
        self.met = 0
        self.missed = 0

    @property
    def share(self) -> float:
        quiet_s = self._clock() - self._learned_at - IDLE_S
        if quiet_s <= 0:
            return self._learned
        return START_SHARE + (self._learned - START_SHARE) * math.exp(-quiet_s / RELAX_S)

    @share.setter
    def share(self, value: float) -> None:
        self._learned, self._learned_at = value, self._clock()

    def observe(self, met_target: bool, queued_at: float | None = None) -> None:
        """A queued request's outcome; `queued_at`: when it was queued (by this clock)."""
        low, high = SHARE_BOUNDS
        before_cut = queued_at is not None and queued_at < self._cut_at
        if met_target:
            self.met += 1
            if not before_cut:
                self.share = min(high, self.share + MET_GAIN)
            return
        self.missed += 1
        if before_cut:
            return
        self.share = max(low, self.share - MISS_COST)
        self._cut_at = self._clock()
