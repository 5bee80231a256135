"""Headless Locust load tests against llmserve on 127.0.0.1, with an SLO gate, a sweep and
Locust's own ceiling. Bounded in users and time; stops every process it started.

    python -m loadtest.run_loadtest all --slo mission              (what `make loadtest` runs)
    python -m loadtest.run_loadtest run --users 32 --duration 60 --slo cpu-smollm2
    python -m loadtest.run_loadtest sweep --users 1,2,4,8,16,32 --step-duration 20
    python -m loadtest.run_loadtest ceiling --users 200 --duration 15
    ... --url http://127.0.0.1:8000   reuse a running server instead of starting one

Writes under --out: Locust's CSVs and HTML report, summary JSON, PNG plots, verdict.md.
Exit status: 0 when the SLO held, 1 on a miss.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest.locust_options import STREAM_HEADERS_NAME
from loadtest.report import benchmark_image, machine_description, publish
from loadtest.server_process import REPO, free_port, start_server
from loadtest.slo import Check, SloTargets, evaluate, highest_passing, load_slo, passed, verdict_table

LOCUSTFILE = REPO / "loadtest" / "locustfile.py"
MAX_USERS = 2000  # bounded: a mistake in flags must not fork-bomb the machine
MAX_DURATION_S = 600


@dataclass(frozen=True)
class LocustRun:
    users: int
    spawn_rate: float
    duration_s: int
    weights: str
    max_tokens: int
    prompt_words: str
    seed: int


def run_locust(url: str, run: LocustRun, prefix: Path, html: bool = True) -> dict[str, Any]:
    """One headless Locust run as its own process; returns the locustfile's HTTP-only summary."""
    if not url.startswith(("http://127.0.0.1", "http://localhost")):
        raise SystemExit(f"load tests target 127.0.0.1 only, not {url}")
    users = min(run.users, MAX_USERS)
    duration = min(run.duration_s, MAX_DURATION_S)
    summary_path = prefix.with_name(prefix.name + "_summary.json")
    command = [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--host", url,
        "-u", str(users), "-r", str(run.spawn_rate), "-t", f"{duration}s", "--stop-timeout", "10",
        "--csv", str(prefix), "--csv-full-history", "--only-summary", "--loglevel", "WARNING",
        "--user-weights", run.weights, "--max-tokens", str(run.max_tokens),
        "--prompt-words", run.prompt_words, "--workload-seed", str(run.seed),
        "--summary-json", str(summary_path),
    ]  # fmt: skip
    if html:
        command += ["--html", str(prefix.with_name(prefix.name + "_report.html"))]
    print(f"locust: {users} users, {duration} s against {url}", file=sys.stderr)
    subprocess.run(command, cwd=REPO, timeout=duration + 120, check=False)
    summary: dict[str, Any] = json.loads(summary_path.read_text())
    summary.update(users=users, duration_limit_s=duration)
    return summary


@contextlib.contextmanager
def llmserve(url: str | None, config: str, out: Path) -> Iterator[str]:
    """Reuse the server at `url`, or start one (and stop it afterwards); either way the Locust
    users ask for the model it serves (LLMSERVE_MODEL, unless set)."""
    if url:
        use_served_model(url)
        yield url
        return
    server = start_server(out / "server.log", "--config", config)
    try:
        server.wait_ready(600)
        use_served_model(server.base_url)
        yield server.base_url
    finally:
        server.stop()


def use_served_model(url: str) -> None:
    import httpx

    if "LLMSERVE_MODEL" in os.environ:
        return
    key = os.environ.get("LLMSERVE_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with contextlib.suppress(httpx.HTTPError, KeyError, IndexError, ValueError):
        models = httpx.get(f"{url}/v1/models", headers=headers, timeout=10).json()
        os.environ["LLMSERVE_MODEL"] = models["data"][0]["id"]


@contextlib.contextmanager
def null_server() -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "loadtest.null_server", "--port", str(port)], cwd=REPO)
    try:
        import httpx

        for _ in range(100):
            with contextlib.suppress(httpx.HTTPError):
                httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={}, timeout=1)
                break
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)


def measure_ceiling(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Locust against the null server: the most this load generator produces on this machine."""
    run = LocustRun(
        args.ceiling_users, args.ceiling_users, args.ceiling_duration, "completion=1", 1, "4,8", 0
    )
    with null_server() as url:
        summary = run_locust(url, run, out / "ceiling", html=False)
    print(f"Locust ceiling (null server, {run.users} users, 1 Locust process): "
          f"{summary['requests_per_s']:.0f} req/s, p99 {summary['p99_ms']} ms", file=sys.stderr)  # fmt: skip
    return summary


def ceiling_line(ceiling: dict[str, Any] | None, targets: SloTargets) -> list[str]:
    if ceiling is None:
        return ["Locust ceiling: not measured in this run (add --ceiling)."]
    line = (f"Locust ceiling on this machine (null server): {ceiling['requests_per_s']:.0f} req/s, "
            f"p99 {ceiling['p99_ms']} ms with {ceiling['users']} users.")  # fmt: skip
    if ceiling["requests_per_s"] < targets.min_requests_per_s:
        return [line, "Locust alone cannot offer the target rate here: a throughput miss is partly Locust's."]
    return [line]


def main_run(
    args: argparse.Namespace, targets: SloTargets, out: Path, url: str
) -> tuple[list[Check], dict[str, Any]]:
    run = LocustRun(args.users, args.spawn_rate, args.duration, args.weights, args.max_tokens,
                    args.prompt_words, args.seed)  # fmt: skip
    summary = run_locust(url, run, out / "run")
    checks = evaluate(summary, targets)
    plot_history(out / "run_stats_history.csv", out / "run_over_time.png")
    return checks, {"summary": summary, "checks": [c.__dict__ for c in checks]}


def sweep(args: argparse.Namespace, targets: SloTargets, out: Path, url: str) -> dict[str, Any]:
    steps: list[tuple[int, list[Check]]] = []
    points = []
    for users in [int(u) for u in args.sweep_users.split(",")]:
        run = LocustRun(users, max(1.0, users / 2), args.step_duration, args.weights, args.max_tokens,
                        args.prompt_words, args.seed)  # fmt: skip
        summary = run_locust(url, run, out / f"sweep_u{users}", html=False)
        checks = evaluate(summary, targets, check_throughput=False)
        steps.append((users, checks))
        points.append({"users": users, **{k: summary[k] for k in ("requests_per_s", "p50_ms", "p99_ms",
                                                                   "failure_ratio")}})  # fmt: skip
        print(f"sweep: {users} users -> {summary['requests_per_s']:.1f} req/s, p99 {summary['p99_ms']} ms, "
              f"{'meets' if passed(checks) else 'breaks'} the latency SLO", file=sys.stderr)  # fmt: skip
        if not passed(checks):
            break
    best = highest_passing(steps)
    best_point = next((p for p in points if p["users"] == best), None)
    plot_sweep(points, targets, out / "sweep.png")
    return {"points": points, "highest_passing_users": best,
            "highest_passing_requests_per_s": best_point and best_point["requests_per_s"]}  # fmt: skip


# ---- plots -----------------------------------------------------------------------------------


def plot_history(history_csv: Path, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    throughput: dict[float, float] = defaultdict(float)
    latency: dict[str, list[tuple[float, float, float, float]]] = defaultdict(list)
    with history_csv.open() as handle:
        rows = list(csv.DictReader(handle))
    if not rows:
        return
    start = float(rows[0]["Timestamp"])
    for row in rows:
        if row["Name"] in ("Aggregated", STREAM_HEADERS_NAME) or row["50%"] in ("N/A", ""):
            continue
        t = float(row["Timestamp"]) - start
        label = f"{row['Type']} {row['Name']}"
        if row["Type"] not in ("TTFT", "TPOT"):
            throughput[t] += float(row["Requests/s"])
        latency[label].append((t, float(row["50%"]), float(row["95%"]), float(row["99%"])))
    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5))
    for label, series in latency.items():
        ts = [s[0] for s in series]
        left.plot(ts, [s[3] for s in series], label=f"{label} p99")
        left.plot(ts, [s[1] for s in series], linestyle="--", label=f"{label} p50")
    left.set_yscale("log")
    left.set_xlabel("seconds")
    left.set_ylabel("ms (log)")
    left.set_title("latency percentiles over time")
    left.legend(fontsize=6)
    times = sorted(throughput)
    right.plot(times, [throughput[t] for t in times])
    right.set_xlabel("seconds")
    right.set_ylabel("requests/s (HTTP)")
    right.set_title("throughput over time")
    figure.tight_layout()
    figure.savefig(png, dpi=110)


def plot_sweep(points: list[dict[str, Any]], targets: SloTargets, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    users = [p["users"] for p in points]
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    left.plot(users, [p["requests_per_s"] for p in points], marker="o")
    left.set_xlabel("concurrent users (offered load)")
    left.set_ylabel("successful requests/s")
    left.set_title("throughput vs offered load")
    right.plot(users, [p["p99_ms"] or 0 for p in points], marker="o", label="p99")
    right.axhline(targets.max_p99_ms, color="red", linestyle="--", label=f"SLO {targets.max_p99_ms:g} ms")
    right.set_xlabel("concurrent users (offered load)")
    right.set_ylabel("ms")
    right.set_title("p99 latency vs offered load")
    right.legend()
    figure.tight_layout()
    figure.savefig(png, dpi=110)


# ---- command line ----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", choices=["run", "sweep", "ceiling", "all"])
    parser.add_argument("--url", help="reuse this running server (127.0.0.1 only)")
    parser.add_argument("--config", default="configs/cpu-smollm2.yaml", help="profile of the server started")
    parser.add_argument("--out", type=Path, default=REPO / "results" / "loadtest")
    parser.add_argument("--slo", default="mission", help="profile in loadtest/slo_profiles.yaml")
    parser.add_argument("--min-rps", type=float, help="override the profile's throughput target")
    parser.add_argument("--max-p99-ms", type=float, help="override the profile's p99 target")
    parser.add_argument("--max-failure-ratio", type=float)
    parser.add_argument("--users", type=int, default=32)
    parser.add_argument("--spawn-rate", type=float, default=8)
    parser.add_argument("--duration", type=int, default=60, help="seconds")
    parser.add_argument("--weights", default="completion=1,stream=1,chat=1")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--prompt-words", default="8,64")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sweep-users", default="1,2,4,8,16,32,64")
    parser.add_argument("--step-duration", type=int, default=20)
    parser.add_argument("--ceiling", action="store_true", help="also measure Locust's ceiling (run mode)")
    parser.add_argument("--ceiling-users", type=int, default=100)
    parser.add_argument("--ceiling-duration", type=int, default=15)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    targets = load_slo(args.slo, min_requests_per_s=args.min_rps, max_p99_ms=args.max_p99_ms,
                       max_failure_ratio=args.max_failure_ratio)  # fmt: skip
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    machine = machine_description()
    report: dict[str, Any] = {"slo": targets.__dict__, "machine": machine, "argv": argv or sys.argv[1:]}
    ceiling = measure_ceiling(args, out) if args.mode in ("ceiling", "all") or args.ceiling else None
    report["locust_ceiling"] = ceiling
    ok = True
    lines: list[str] = []
    if args.mode in ("run", "sweep", "all"):
        with llmserve(args.url, args.config, out) as url:
            if args.mode in ("run", "all"):
                checks, result = main_run(args, targets, out, url)
                ok = passed(checks)
                report["run"] = result
                lines.append(verdict_table(checks, targets, machine, ceiling_line(ceiling, targets)))
                for name, row in result["summary"]["stream_metrics"].items():
                    lines.append(
                        f"{name}: p50 {row['p50_ms']} ms, p99 {row['p99_ms']} ms ({row['count']} streams)"
                    )
            if args.mode in ("sweep", "all"):
                report["sweep"] = sweep(args, targets, out, url)
                best = report["sweep"]["highest_passing_users"]
                lines.append(
                    f"Sweep: highest load meeting p99 <= {targets.max_p99_ms:g} ms and failures < "
                    f"{targets.max_failure_ratio:.0%}: "
                    + (
                        f"{best} users, {report['sweep']['highest_passing_requests_per_s']:.1f} req/s"
                        if best is not None
                        else "none of the steps"
                    )
                )
    elif ceiling is not None:
        lines += ceiling_line(ceiling, targets)
    text = "\n".join(lines)
    print(text)
    (out / "verdict.md").write_text(text + "\n")
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str))
    if args.mode == "all" and args.url is None:  # a full run against a server it started: publish it
        images = []
        for source, target in (("run_over_time.png", f"loadtest-{args.slo}-run.png"),
                               ("sweep.png", f"loadtest-{args.slo}-sweep.png")):  # fmt: skip
            if (out / source).exists():
                shutil.copy(out / source, benchmark_image(target))
                images.append(benchmark_image(target))
        flags = " ".join(argv or sys.argv[1:])
        command = f"make loadtest SLO={args.slo}  # python -m loadtest.run_loadtest {flags}"
        published = publish(
            f"loadtest-{args.slo}", f"Load test, SLO {args.slo}", command, text, tuple(images)
        )
        print(f"wrote {published}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
