"""The rate at which requests arrive: what sets the batch a newly admitted request will share.

Admission plans a request at the batch the arrivals keep running, N = rate x service(N) (Little's
law, policy/admission.py). Near the engine's capacity that fixed point is steep: on the Zen 4
host at half the bench's capacity (5.1 a second, true N ~13), a traced refusal had the rate read
at 7.9 a second and the batch planned at 63, at which a 48-token request would have missed its
deadline. So the rate must not follow Poisson noise, yet must follow a real change within a
second or two:

- **steady**: the arrivals over the last LONG_WINDOW_S (at 5 a second, ~50 of them: +-14 %);
- **changed**: where the last SHORT_WINDOW_S hold more or fewer arrivals than the steady rate
  explains (beyond CHANGE_Z standard deviations of a Poisson count), the short window's rate: a
  load's ramp, its end, a burst. Counted from its first arrival once there are enough, so that a
  load begun after a quiet spell within the long window (a drain between loads) stands out
  within half a second or so: counted over the whole 2 s, the quiet hid it for 1.1-1.4 s.

Simulated at every arrival of a steady 5.1 a second, the rate over 2 s alone (as before) read 6.1
at the median and 10.8 at p99, and with the host's fitted step times planned a batch of 57 or
more at one arrival in six; this reads 5.1 and 7.1, and one in 250. A step from 5.1 to 20 a
second reads 15 after 1.2 s (1.1 s before); one from 20 back to 5.1 reads under 7.1 after 1.8 s,
as before; 20 a second begun 3 or 6 s after 20 s of 10 a second reads 15 after 0.7 and 0.6 s
(0.6 s before).

Both windows count from their first arrival once MIN_COUNTED have come, so the idle spell before
a load is not averaged into its rate. Fewer: a trickle, over the short window, or the first
arrivals of a load, too few yet to tell which; read as the larger of the two, the count over the
window or a cautious reading of a load begun at the first of them (its rate's lower 10 % bound,
from 3 arrivals on). Read over the window alone, each load's first 7 requests were planned at the
batch a trickle keeps running: at 4x the CPU engine's capacity they were admitted at once into a
batch that grew to 58, took 2-4x their prediction, and 8 of the load's 70 answered at once came
late (3 of 69 read this way). Simulated in 300 seeded loads (Poisson, after a quiet spell or 7 s
after a load of 30 a second), one of 59 a second reads 12 a second or more (where this CPU
engine's batch is planned full) at its 3rd arrival at the median and its 4th at p90 (the 8th
before); one of 30 a second at its 4th (8th), and at its 8th or 11th at p90 (8th or 12th). A
steady 0.5 a second reads 4.7 at p99.9 (3.0 before); from 1 a second up, steady loads read as
before.
"""

from __future__ import annotations

import math
from collections import deque

SHORT_WINDOW_S = 2.0
LONG_WINDOW_S = 10.0
MIN_COUNTED = 8
CHANGE_Z = 3.0
# The 10 % quantile of a Gamma(k, 1) variable, the time k Poisson gaps take at a rate of one a
# second (scipy.stats.gamma.ppf(0.1, k)), for k from 2 to MIN_COUNTED - 2: k gaps over t seconds
# came at a rate of at least this / t, 9 times in 10.
ONSET_GAPS_10TH_PERCENTILE = {2: 0.5318, 3: 1.1021, 4: 1.7448, 5: 2.4326, 6: 3.1519}


class ArrivalRate:
    def __init__(self) -> None:
        self._short: deque[float] = deque()
        self._long: deque[float] = deque()

    def arrive(self, at: float) -> None:
        self._short.append(at)
        self._long.append(at)

    def take_back(self) -> None:
        """Forget the last arrival (a request refused after all)."""
        self._short.pop()
        self._long.pop()

    def per_second(self, now: float) -> float:
        short = _counted(self._short, now, SHORT_WINDOW_S)
        long = _counted(self._long, now, LONG_WINDOW_S)
        if len(long) < MIN_COUNTED:
            return _few_per_second(short, now)
        steady = _per_second(long, now)
        # The short window's own rate, and the count and span it is read from: after its first
        # arrival once there are enough (a load that began after an idle spell within the long
        # window), else over all of it (a trickle, or a load's end).
        if len(short) >= MIN_COUNTED:
            recent, counted, span = _per_second(short, now), len(short) - 1, now - short[0]
        else:
            span = min(SHORT_WINDOW_S, now - long[0])
            recent, counted = _few_per_second(short, now), len(short)
        expected = steady * span
        if abs(counted - expected) <= CHANGE_Z * math.sqrt(max(expected, 1.0)):
            return steady
        return recent


def _few_per_second(arrivals: deque[float], now: float) -> float:
    """Fewer than MIN_COUNTED arrivals in the short window: a trickle counted over the window, or
    the first of a load, at the lower 10 % bound of the rate they came at; the larger."""
    over_window = len(arrivals) / SHORT_WINDOW_S
    gaps_quantile = ONSET_GAPS_10TH_PERCENTILE.get(len(arrivals) - 1)
    if gaps_quantile is None or now <= arrivals[0]:
        return over_window
    return max(over_window, gaps_quantile / (now - arrivals[0]))


def _per_second(arrivals: deque[float], now: float) -> float:
    """The arrivals after the first over the time since it: the first only marks where counting
    starts (counted too, the rate read high by one arrival in the window: +19 % over 2 s at 5 a
    second)."""
    return (len(arrivals) - 1) / max(now - arrivals[0], 1e-3)


def _counted(arrivals: deque[float], now: float, window_s: float) -> deque[float]:
    while arrivals and arrivals[0] < now - window_s:
        arrivals.popleft()
    return arrivals
