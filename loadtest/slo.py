"""The SLO gate: compare a load test's achieved figures with targets and say, plainly, pass or miss."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

PROFILES_PATH = Path(__file__).with_name("slo_profiles.yaml")


@dataclass(frozen=True)
class SloTargets:
    name: str
    description: str
    hardware: str
    min_requests_per_s: float
    max_p99_ms: float
    max_failure_ratio: float


@dataclass(frozen=True)
class Check:
    metric: str
    target: str
    achieved: str
    passed: bool
    distance: str


def load_slo(name: str, path: Path = PROFILES_PATH, **overrides: float | None) -> SloTargets:
    profiles: dict[str, dict[str, Any]] = yaml.safe_load(path.read_text(encoding="utf-8"))
    if name not in profiles:
        raise SystemExit(f"unknown SLO profile {name!r}; {path} has: {', '.join(profiles)}")
    targets = SloTargets(name=name, **profiles[name])
    return replace(targets, **{key: value for key, value in overrides.items() if value is not None})


def evaluate(summary: dict[str, Any], targets: SloTargets, *, check_throughput: bool = True) -> list[Check]:
    """One check per target; `summary` is what the locustfile writes with --summary-json."""
    checks = []
    rps = float(summary["requests_per_s"])
    if check_throughput:
        checks.append(
            Check(
                "throughput (successful req/s)",
                f">= {targets.min_requests_per_s:g}",
                f"{rps:.1f}",
                rps >= targets.min_requests_per_s,
                f"{rps / targets.min_requests_per_s:.3g}x of target",
            )
        )
    p99 = summary.get("p99_ms")
    checks.append(
        Check(
            "p99 latency (ms)",
            f"<= {targets.max_p99_ms:g}",
            "no requests" if p99 is None else f"{p99:.0f}",
            p99 is not None and p99 <= targets.max_p99_ms,
            "-" if p99 is None else f"{p99 / targets.max_p99_ms:.3g}x of limit",
        )
    )
    failure_ratio = float(summary["failure_ratio"])
    checks.append(
        Check(
            "failure ratio",
            f"< {targets.max_failure_ratio:.1%}",
            f"{failure_ratio:.2%}",
            failure_ratio < targets.max_failure_ratio,
            f"{summary['failures']} of {summary['requests']} requests",
        )
    )
    return checks


def passed(checks: list[Check]) -> bool:
    return all(check.passed for check in checks)


def verdict_table(
    checks: list[Check], targets: SloTargets, machine: str, extra: list[str] | None = None
) -> str:
    lines = [
        f"SLO profile: {targets.name} ({targets.description}; targets set for: {targets.hardware})",
        f"Ran on: {machine}",
        "",
        "| metric | target | achieved | verdict | distance |",
        "| --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {c.metric} | {c.target} | {c.achieved} | {'PASS' if c.passed else 'MISS'} | {c.distance} |"
        for c in checks
    ]
    lines += ["", f"VERDICT: {'PASS' if passed(checks) else 'MISS'}", *(extra or [])]
    return "\n".join(lines)


def highest_passing(steps: list[tuple[int, list[Check]]]) -> int | None:
    """The highest load of the sweep's leading run of passing steps (a pass after a miss is noise)."""
    best = None
    for load, checks in steps:
        if not passed(checks):
            break
        best = load
    return best
