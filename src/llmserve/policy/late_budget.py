"""The SLO's error budget for late answers, spent on queued requests rather than slow refusals.

The e2e target is a 99th percentile: one admitted request in a hundred may finish after its
deadline. A queued request plans on a slow service (the model's tail) and is refused after
waiting when that no longer fits, seconds after it arrived; under overload those few slow
refusals (1 of 92 refusals at 1.5x on the CPU engine, 10 of 756 at 4x) put the refusals' p99 in
seconds, while almost no admitted request came late (0-2 of 340-390 a load). So while the
admitted requests of late have missed fewer deadlines than the budget allows, a queued request
whose median service still fits is admitted instead, counted against the budget as late until it
finishes ("at risk"); when the budget is spent, queued requests plan on the tail again. The
headroom (policy/headroom.py) learns an admission at risk as the miss the refusal would have been.
"""

from __future__ import annotations

from collections import deque

BUDGET_SHARE = 0.01  # the e2e target's percentile: late answers per admitted request
WINDOW = 500  # the admitted requests with a deadline that the budget is counted over, the latest
MIN_SEEN = 100  # fewer seen say too little: no budget (a fresh server plans on the tail)


class LateBudget:
    def __init__(self) -> None:
        self._late: deque[bool] = deque(maxlen=WINDOW)
        self._late_count = 0
        self.at_risk = 0  # admitted on the budget, not yet finished

    def has_room(self) -> bool:
        """Whether one more request may be admitted at risk of coming late."""
        seen = len(self._late)
        return seen >= MIN_SEEN and self._late_count + self.at_risk + 1 <= BUDGET_SHARE * seen

    def take(self) -> None:
        self.at_risk += 1

    def finished(self, late: bool | None, at_risk: bool) -> None:
        """An admitted request left: `late` whether it finished after its deadline (None: it had
        none, or did not complete); `at_risk` whether it was admitted on the budget."""
        if at_risk:
            self.at_risk -= 1
        if late is None:
            return
        if len(self._late) == WINDOW and self._late[0]:
            self._late_count -= 1
        self._late.append(late)
        self._late_count += late
