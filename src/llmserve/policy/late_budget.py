"""The SLO's error budget for late answers, spent on queued requests rather than slow refusals.

The e2e target is a 99th percentile: one admitted request in a hundred may finish after its
deadline. A queued request plans on a slow service (the model's tail) and is refused after
waiting when that no longer fits, seconds after it arrived; under overload those few slow
refusals (1 of 92 refusals at 1.5x on the CPU engine, 10 of 756 at 4x) put the refusals' p99 in
seconds, while almost no admitted request came late (0-2 of 340-390 a load). So while the
admitted requests of late have missed fewer deadlines than the budget allows, a queued request
whose median service still fits is admitted instead ("at risk"); when the budget is spent,
queued requests plan on the tail again. The headroom (policy/headroom.py) learns an admission at
risk as the miss the refusal would have been.

A request at risk is counted against the budget, until it finishes, by the chance that it comes
late: the share of the latest ones at risk that did (Laplace's rule: a half before any came
out). Counted as late outright, four at a time filled the budget while most of them (22 of 27 on
the CPU engine) came in time, and the queue refused the rest of a load's start after waiting.
"""

from __future__ import annotations

from collections import deque

BUDGET_SHARE = 0.01  # the e2e target's percentile: late answers per admitted request
WINDOW = 500  # the admitted requests with a deadline that the budget is counted over, the latest
MIN_SEEN = 100  # fewer seen say too little: no budget (a fresh server plans on the tail)
AT_RISK_WINDOW = 50  # the latest requests at risk whose outcomes give the chance of the next


class LateBudget:
    def __init__(self) -> None:
        self._late: deque[bool] = deque(maxlen=WINDOW)
        self._late_count = 0
        self._at_risk_late: deque[bool] = deque(maxlen=AT_RISK_WINDOW)
        self.at_risk = 0  # admitted on the budget, not yet finished

    def late_chance(self) -> float:
        """The chance that a request admitted at risk comes late, as the latest ones did."""
        outcomes = self._at_risk_late
        return (sum(outcomes) + 1) / (len(outcomes) + 2)

    def has_room(self) -> bool:
        """Whether one more request may be admitted at risk of coming late: the late answers
        among the latest admitted, and those expected of the ones at risk with it, are within
        the budget."""
        seen = len(self._late)
        expected = self._late_count + self.late_chance() * (self.at_risk + 1)
        return seen >= MIN_SEEN and expected <= BUDGET_SHARE * seen

    def take(self) -> None:
        self.at_risk += 1

    def finished(self, late: bool | None, at_risk: bool) -> None:
        """An admitted request left: `late` whether it finished after its deadline (None: it had
        none, or did not complete); `at_risk` whether it was admitted on the budget."""
        if at_risk:
            self.at_risk -= 1
        if late is None:
            return
        if at_risk:
            self._at_risk_late.append(late)
        if len(self._late) == WINDOW and self._late[0]:
            self._late_count -= 1
        self._late.append(late)
        self._late_count += late
