"""What the robustness tests tried and saw, printed at the end of the session (docs/testing.md)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class RobustnessLedger:
    cases: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    orphaned_engine_requests: int = 0
    peak_rss_mb: float = 0.0
    notes: list[str] = field(default_factory=list)

    def record(self, category: str, status: int) -> None:
        self.cases[category] += 1
        self.statuses[status] += 1

    def observe_rss(self, rss_mb: float) -> None:
        self.peak_rss_mb = max(self.peak_rss_mb, rss_mb)

    def summary(self) -> str:
        if not self.cases:
            return ""
        lines = ["robustness summary (tests/integration: fuzz, abuse, faults, concurrency):"]
        lines += [f"  {category}: {count} cases" for category, count in sorted(self.cases.items())]
        by_status = ", ".join(f"{s}: {n}" for s, n in sorted(self.statuses.items()))
        lines.append(f"  responses by status: {by_status}")
        five_xx = sum(n for s, n in self.statuses.items() if s >= 500)
        lines.append(f"  5xx responses: {five_xx}")
        lines.append(f"  orphaned engine requests (disconnects, fuzzing): {self.orphaned_engine_requests}")
        if self.peak_rss_mb:  # measured by the fuzzing and burst tests only
            lines.append(f"  peak server RSS (process tree): {self.peak_rss_mb:.0f} MiB")
        lines += [f"  {note}" for note in self.notes]
        return "\n".join(lines)


LEDGER = RobustnessLedger()
