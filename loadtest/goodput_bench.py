"""Goodput under overload: `vllm serve`, llmserve without admission and llmserve with SLO admission,
side by side in one run, on the same model, engine arguments and seeded requests.

    python -m loadtest.goodput_bench            (what `make bench-overload` runs)
    python -m loadtest.goodput_bench --loads 2,3 --duration 60 --burst 0 --page overload-sustained
                                                (`make bench-overload-sustained`)

1. Capacity: llmserve without admission, 64 clients back to back: completions per second (C)
   and the e2e p50 of a request at that batch (S).
2. The SLO: e2e p99 target T (--e2e-slo; default 2 x S, rounded up to 0.5 s).
3. For each server: open-loop Poisson arrivals at each --loads multiple of C for --duration s,
   then a burst of --burst x C x T requests at once after --idle s of nothing (--burst 0: none).
   Client timeout 3 T: a request unanswered by then has failed. A load shorter than T flatters a
   server without admission: its queue stops growing before a request waits T, and every request
   queued at the end is served by the drain; --duration 60 shows the overload it is meant to be.
4. Per server and load: goodput (answered 200 within T, per second of arrivals), throughput,
   admitted p50/p99, refusals and their p99 as the client saw them and, for llmserve, as the
   server measured them (llmserve_rejection_latency_seconds: all, and those refused at arrival
   apart from those refused after waiting in the queue), and false refusals (refused at a load
   where a server without admission answered every request within T).
5. The capacity again, on the server without admission once its loads are done, and the engine
   step each llmserve server's calibration measured at its start: the page says when either
   moved by more than 15 % during the run.

Writes results/goodput/{goodput.json,goodput.png,logs/} and docs/benchmarks/<--page>.md (default
overload; a partial run, with --capacity or fewer --servers, leaves the docs alone). Loopback only,
bounded in count and time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp
import httpx
import uvloop

from loadtest.bench_driver import percentile
from loadtest.prom import Scrape, beyond_last_bound, bucket_deltas, delta, histogram_quantile
from loadtest.report import BENCHMARK_DOCS, benchmark_image, publish
from loadtest.server_process import REPO, ServerProcess, start_server, start_vllm_serve
from loadtest.workload import seeded_prompt

PROFILE = REPO / "configs" / "cpu-smollm2.yaml"
JSON_HEADERS = {"Content-Type": "application/json"}
DEFAULT_SERVERS = "vllm,off,slo"
DEFAULT_PAGE = "overload"  # without --page: docs/benchmarks/<this>.md
SIMULATED_PAGE = "overload-sim-h200"  # without --page, with the simulated H200's profile
# The make target that writes each page (what the page says to run again).
MAKE_TARGETS = {
    DEFAULT_PAGE: "bench-overload",
    SIMULATED_PAGE: "bench-overload-sim",
    "overload-sustained": "bench-overload-sustained",
}
CAPACITY_DRIFT = 0.15  # more than this apart, the page says the machine's speed moved


@dataclass
class Outcome:
    status: int
    latency_s: float


@dataclass(frozen=True)
class ServerMs:
    """A quantile of llmserve's own latency histogram, in ms; at_least when it lies past the
    histogram's last finite edge, which is all the histogram can then say of it."""

    ms: float
    at_least: bool = False

    def cell(self) -> str:
        return f"≥{self.ms:.0f}" if self.at_least else f"{self.ms:.1f}"


@dataclass
class Row:
    server: str
    load: str
    offered_rps: float
    offered: int
    ok: int
    good: int
    refused: int
    failed: int
    goodput_rps: float
    throughput_rps: float
    admitted_p50_s: float
    admitted_p99_s: float
    refusal_p99_client_ms: float
    refusal_p99_server_ms: ServerMs | None
    arrival_refusal_p99_server_ms: ServerMs | None  # those refused at arrival, not after waiting
    refused_after_waiting: int | None  # llmserve's count of slow refusals (queued, then refused)
    refused_by_front_end: int | None  # llmserve's count of refusals for its event loop's lag
    # llmserve's queued requests: what they took over what admission predicted, at the median,
    # and their wait for admission over the queue's forecast of it
    queued_prediction_p50: float | None = None
    queued_wait_p50: float | None = None
    # llmserve's admitted requests the engine finished after their e2e deadline (run at once,
    # queued), and those admitted without one (best effort)
    missed_deadlines: tuple[int, int, int] | None = None
    # llmserve's queued requests admitted on the late-answer budget: (admitted, late)
    admitted_at_risk: tuple[int, int] | None = None
    false_refusals: int | None = None


def request_body(rng: random.Random, args: argparse.Namespace) -> bytes:
    """One seeded completion request, serialized before the clock starts."""
    body = {
        "model": args.model,
        "prompt": seeded_prompt(rng, 16, 96),
        "max_tokens": rng.randint(*args.max_tokens),
        "ignore_eos": True,
        "temperature": 0,
    }
    return json.dumps(body).encode()


async def send(http: Client, body: bytes, outcomes: list[Outcome]) -> None:
    started = time.perf_counter()
    try:
        async with http.session.post(http.url, data=body, headers=JSON_HEADERS) as response:
            await response.read()
            status = response.status
    except (aiohttp.ClientError, TimeoutError):
        status = 0
    outcomes.append(Outcome(status, time.perf_counter() - started))


@dataclass
class Client:
    """aiohttp on uvloop: at GPU rates (the simulated profile) the load generator shares the two
    cores with the server, and httpx would spend ~4x its CPU per request."""

    session: aiohttp.ClientSession
    url: str


@asynccontextmanager
async def client(base_url: str, timeout_s: float) -> AsyncIterator[Client]:
    connector = aiohttp.TCPConnector(limit=4096)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        yield Client(session, f"{base_url}/v1/completions")


async def poisson(
    base_url: str, rate: float, duration_s: float, seed: int, args: argparse.Namespace
) -> list[Outcome]:
    rng, outcomes = random.Random(seed), []
    arrivals, next_at = [], 0.0
    while next_at < duration_s:
        arrivals.append((next_at, request_body(rng, args)))
        next_at += rng.expovariate(rate)
    async with client(base_url, args.timeout) as http:
        tasks, started = [], time.monotonic()
        for at, body in arrivals:
            await asyncio.sleep(max(0.0, started + at - time.monotonic()))
            tasks.append(asyncio.create_task(send(http, body, outcomes)))
        await asyncio.gather(*tasks)
    return outcomes


async def burst(base_url: str, count: int, seed: int, args: argparse.Namespace) -> list[Outcome]:
    rng, outcomes = random.Random(seed), []
    bodies = [request_body(rng, args) for _ in range(count)]
    async with client(base_url, args.timeout) as http:
        await asyncio.gather(*(send(http, body, outcomes) for body in bodies))
    return outcomes


async def closed_loop(
    base_url: str, clients: int, duration_s: float, args: argparse.Namespace
) -> list[Outcome]:
    outcomes: list[Outcome] = []
    stop_at = time.monotonic() + duration_s

    async def worker(index: int, http: Client) -> None:
        rng = random.Random(index)
        while time.monotonic() < stop_at:
            await send(http, request_body(rng, args), outcomes)

    async with client(base_url, args.timeout) as http:
        await asyncio.gather(*(worker(i, http) for i in range(clients)))
    return outcomes


def buckets_between(
    before: Scrape | None, after: Scrape | None, name: str, **only: str
) -> list[tuple[float, float]] | None:
    """The buckets histogram `name` gained between two scrapes of llmserve; None for a server
    that does not export it, or without scrapes."""
    if before is None or after is None or not after.has(f"{name}_bucket"):
        return None
    return bucket_deltas(after, before, name, **only)


def quantile_between(
    before: Scrape | None, after: Scrape | None, quantile: float, name: str, **only: str
) -> float | None:
    """The quantile of histogram `name` over what it gained between two scrapes of llmserve."""
    buckets = buckets_between(before, after, name, **only)
    return None if buckets is None else histogram_quantile(quantile, buckets)


def refusal_p99_server_ms(before: Scrape | None, after: Scrape | None, **only: str) -> ServerMs | None:
    buckets = buckets_between(before, after, "llmserve_rejection_latency_seconds", **only)
    if buckets is None or (p99 := histogram_quantile(0.99, buckets)) is None:
        return None
    return ServerMs(p99 * 1000, at_least=beyond_last_bound(0.99, buckets))


def queued_prediction_p50(before: Scrape | None, after: Scrape | None) -> float | None:
    """The median of what queued requests took over what admission predicted when it queued them."""
    return quantile_between(before, after, 0.5, "llmserve_admission_e2e_prediction_ratio", decision="queued")


def queued_wait_p50(before: Scrape | None, after: Scrape | None) -> float | None:
    """The median of what queued requests waited for admission over the queue's forecast."""
    return quantile_between(before, after, 0.5, "llmserve_admission_queue_wait_prediction_ratio")


def missed_deadlines(before: Scrape | None, after: Scrape | None) -> tuple[int, int, int] | None:
    """llmserve's admitted requests that the engine finished after their e2e deadline, between the
    scrapes: (run at once, queued), then those admitted without a deadline (best effort: predicted
    to miss it even alone); None where none was counted (not llmserve, or no admission)."""
    name = "llmserve_admission_deadline_outcomes_total"
    if before is None or after is None or not after.has(name) or delta(after, before, name) == 0:
        return None

    def count(outcome: str, **decision: str) -> int:
        return round(delta(after, before, name, outcome=outcome, **decision))

    return (
        count("missed", decision="run_at_once"),
        count("missed", decision="queued"),
        count("best_effort"),
    )


def admitted_at_risk(before: Scrape | None, after: Scrape | None) -> tuple[int, int] | None:
    """llmserve's queued requests admitted on the late-answer budget between the scrapes, and how
    many of them the engine finished late; None where none were counted (not llmserve, or a
    version without the budget)."""
    name = "llmserve_admission_admitted_at_risk_total"
    if before is None or after is None or not after.has(name):
        return None
    return round(delta(after, before, name)), round(delta(after, before, name, outcome="missed"))


def rejections(before: Scrape | None, after: Scrape | None, reason: str) -> int | None:
    """llmserve's count of refusals for `reason` between the scrapes (None: not llmserve)."""
    if before is None or after is None or not after.has("llmserve_requests_total"):
        return None
    return round(delta(after, before, "llmserve_rejections_total", reason=reason))


def row(
    server: str,
    load: str,
    rate: float,
    window_s: float,
    outcomes: list[Outcome],
    slo_s: float,
    before: Scrape | None,
    after: Scrape | None,
) -> Row:
    ok = [o.latency_s for o in outcomes if o.status == 200]
    refused = [o.latency_s * 1000 for o in outcomes if o.status == 429]
    good = sum(1 for latency in ok if latency <= slo_s)
    return Row(
        server=server,
        load=load,
        offered_rps=rate,
        offered=len(outcomes),
        ok=len(ok),
        good=good,
        refused=len(refused),
        failed=len(outcomes) - len(ok) - len(refused),
        goodput_rps=good / window_s,
        throughput_rps=len(ok) / window_s,
        admitted_p50_s=percentile(ok, 50),
        admitted_p99_s=percentile(ok, 99),
        refusal_p99_client_ms=percentile(refused, 99),
        refusal_p99_server_ms=refusal_p99_server_ms(before, after),
        arrival_refusal_p99_server_ms=refusal_p99_server_ms(before, after, when="at_arrival"),
        refused_after_waiting=rejections(before, after, "overloaded_after_waiting"),
        refused_by_front_end=rejections(before, after, "front_end_overloaded"),
        queued_prediction_p50=queued_prediction_p50(before, after),
        queued_wait_p50=queued_wait_p50(before, after),
        missed_deadlines=missed_deadlines(before, after),
        admitted_at_risk=admitted_at_risk(before, after),
    )


def scrape(server: ServerProcess) -> Scrape | None:
    try:
        return server.scrape()
    except httpx.HTTPError:
        return None


def wait_idle(server: ServerProcess, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        current = scrape(server)
        if (
            current is None
            or current.value("vllm:num_requests_running") + current.value("vllm:num_requests_waiting") == 0
        ):
            return
        time.sleep(0.5)


def measure_capacity(args: argparse.Namespace, workdir: Path) -> tuple[float, float, float | None]:
    """Capacity, its e2e p50, and the server's calibrated step (ms, `calibrated_step_ms`)."""
    server = start_server(
        workdir / "capacity.log", "--config", str(args.profile), "--set", "admission.enabled=false"
    )
    try:
        server.wait_ready(300)
        step_ms = calibrated_step_ms(scrape(server))
        uvloop.run(closed_loop(server.base_url, 8, 5, args))  # warm
        return (*closed_loop_capacity(server, args), step_ms)
    finally:
        server.stop()


def calibrated_step_ms(scraped: Scrape | None) -> float | None:
    """Admission's predicted engine step at a batch of 1, in ms, read as the server reports ready
    (None for a server that does not export it): what the same start-up calibration measured,
    the step alone and the prompt tokens its steps took in, so the machine's speed as that server
    met it."""
    name = "llmserve_admission_predicted_step_seconds"
    if scraped is None or not scraped.has(name):
        return None
    return scraped.value(name, batch="1") * 1000


def engine_speeds(steps_ms: dict[str, float]) -> str:
    """What the page says of the step each llmserve server calibrated at its start."""
    if not steps_ms:
        return ""
    said = "Engine step at a batch of 1 as each llmserve server calibrated it at its start: " + ", ".join(
        f"{name} {ms:.1f} ms" for name, ms in steps_ms.items()
    )
    if max(steps_ms.values()) <= (1 + CAPACITY_DRIFT) * min(steps_ms.values()):
        return said + ". "
    return (
        said + ": the machine's speed moved between them, so a load's multiple of the capacity is "
        "not the same overload for each server. "
    )


def closed_loop_capacity(server: ServerProcess, args: argparse.Namespace) -> tuple[float, float]:
    """Completions per second with --clients back to back, and their e2e p50."""
    started = time.monotonic()
    outcomes = uvloop.run(closed_loop(server.base_url, args.clients, args.capacity_duration, args))
    elapsed = time.monotonic() - started
    ok = [o.latency_s for o in outcomes if o.status == 200]
    return len(ok) / elapsed, percentile(ok, 50)


def capacity_drift(capacity: float, after: float | None) -> str:
    """What the page says of the capacity measured again after the loads."""
    if after is None:
        return ""
    said = f"Measured again after the loads of llmserve without admission: {after:.1f} req/s"
    if abs(after - capacity) <= CAPACITY_DRIFT * capacity:
        return said + ". "
    return (
        said + f", {after / capacity:.2f}x the first: the machine's speed moved during the run, so "
        "the loads' multiples (of the first) overstate or understate the overload. "
    )


def run_server(
    name: str,
    server: ServerProcess,
    args: argparse.Namespace,
    capacity: float,
    slo_s: float,
    steps_ms: dict[str, float | None],
    measure_capacity_again: bool = False,
) -> tuple[list[Row], float | None]:
    """Its rows, and the capacity measured again once its loads are done (if asked, else None);
    its calibrated step into `steps_ms`."""
    rows: list[Row] = []
    capacity_after: float | None = None
    try:
        server.wait_ready(600)
        steps_ms[name] = calibrated_step_ms(scrape(server))
        uvloop.run(closed_loop(server.base_url, 4, 3, args))  # warm
        for multiple in args.loads:
            rate = multiple * capacity
            print(f"[{name}] {multiple:g}x capacity: {rate:.1f} req/s for {args.duration:g} s", flush=True)
            before = scrape(server)
            # Seeded by the load, so that a partial run (--loads) offers the same requests at it.
            seed = args.seed + round(multiple * 100)
            outcomes = uvloop.run(poisson(server.base_url, rate, args.duration, seed, args))
            wait_idle(server, args.timeout)
            rows.append(
                row(name, f"{multiple:g}x", rate, args.duration, outcomes, slo_s, before, scrape(server))
            )
        if args.burst > 0:
            count = max(1, math.ceil(args.burst * capacity * slo_s))
            print(f"[{name}] {args.idle:g} s idle, then a burst of {count}", flush=True)
            time.sleep(args.idle)
            before = scrape(server)
            outcomes = uvloop.run(burst(server.base_url, count, args.seed + 99, args))
            wait_idle(server, args.timeout)
            # A burst's goodput is per second of the SLO: how many it answered in time.
            rows.append(
                row(name, f"burst {count}", float("nan"), slo_s, outcomes, slo_s, before, scrape(server))
            )
        if measure_capacity_again:
            print(f"[{name}] capacity again", flush=True)
            capacity_after = closed_loop_capacity(server, args)[0]
    finally:
        server.stop()
    return rows, capacity_after


def mark_false_refusals(rows: list[Row]) -> None:
    """A refusal is false at a load where a server without admission (vllm serve, or llmserve
    without it) answered every request within the SLO: waiting would have served it in time."""
    served_all = {r.load for r in rows if not r.server.startswith("llmserve, SLO") and r.good == r.offered}
    for r in rows:
        if r.server.startswith("llmserve, SLO"):
            r.false_refusals = r.refused if r.load in served_all else 0


def table(rows: list[Row]) -> str:
    lines = [
        "| server | load | offered req/s | offered | 200 | within SLO | 429 | failed | goodput req/s | "
        "throughput req/s | admitted p50 s | admitted p99 s | 429 p99 client ms | 429 p99 server ms | "
        "429 at arrival p99 server ms | 429 after waiting | 429 front end | false 429 | "
        "queued p50: took / predicted; waited / forecast | "
        "late by the engine: at once / queued (at risk: late of admitted); best effort |",
        "| --- | --- " + "| ---: " * 18 + "|",
    ]
    for r in rows:
        server_ms = "n/a" if r.refusal_p99_server_ms is None else r.refusal_p99_server_ms.cell()
        arrival = r.arrival_refusal_p99_server_ms
        arrival_ms = "n/a" if arrival is None else arrival.cell()
        false = "n/a" if r.false_refusals is None else str(r.false_refusals)
        slow = "n/a" if r.refused_after_waiting is None else str(r.refused_after_waiting)
        front = "n/a" if r.refused_by_front_end is None else str(r.refused_by_front_end)
        ratio = "n/a" if r.queued_prediction_p50 is None else f"{r.queued_prediction_p50:.2f}"
        if r.queued_wait_p50 is not None:
            ratio += f"; {r.queued_wait_p50:.2f}"
        late = "n/a"
        if r.missed_deadlines is not None:
            at_once, queued, best_effort = r.missed_deadlines
            risk = ""
            if r.admitted_at_risk is not None:
                admitted, missed = r.admitted_at_risk
                risk = f" ({missed} of {admitted})"
            late = f"{at_once} / {queued}{risk}; {best_effort}"
        lines.append(
            f"| {r.server} | {r.load} | {r.offered_rps:.1f} | {r.offered} | {r.ok} | {r.good} | "
            f"{r.refused} | "
            f"{r.failed} | {r.goodput_rps:.2f} | {r.throughput_rps:.2f} | {r.admitted_p50_s:.2f} | "
            f"{r.admitted_p99_s:.2f} | {r.refusal_p99_client_ms:.0f} | {server_ms} | "
            f"{arrival_ms} | {slow} | {front} | {false} | {ratio} | {late} |"
        )
    return "\n".join(lines)


def plot(rows: list[Row], capacity: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (goodput, latency) = plt.subplots(1, 2, figsize=(12, 4.5))
    for server in dict.fromkeys(r.server for r in rows):
        points = [r for r in rows if r.server == server and not r.load.startswith("burst")]
        loads = [r.offered_rps / capacity for r in points]
        goodput.plot(loads, [r.goodput_rps / capacity for r in points], marker="o", label=server)
        latency.plot(loads, [r.admitted_p99_s for r in points], marker="o", label=server)
    goodput.set_xlabel("offered load (x capacity)")
    goodput.set_ylabel("goodput (x capacity)")
    goodput.set_title("requests answered within the SLO, per second")
    latency.set_xlabel("offered load (x capacity)")
    latency.set_ylabel("p99 e2e of answered requests (s)")
    latency.set_title("latency of what was answered")
    for axis in (goodput, latency):
        axis.grid(alpha=0.3)
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--loads", type=lambda s: [float(x) for x in s.split(",")], default=[0.5, 1, 1.5, 2, 3, 4]
    )
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of arrivals per load")
    parser.add_argument("--capacity-duration", type=float, default=20.0)
    parser.add_argument("--clients", type=int, default=64, help="closed-loop clients for the capacity")
    parser.add_argument("--max-tokens", type=lambda s: tuple(int(x) for x in s.split(",")), default=(16, 48))
    parser.add_argument("--e2e-slo", type=float, help="seconds; default 2 x e2e p50 at capacity")
    parser.add_argument(
        "--capacity", type=float, help="req/s, measured before (skips step 1; needs --e2e-slo)"
    )
    parser.add_argument(
        "--burst", type=float, default=2.0, help="burst size in units of capacity x SLO; 0: no burst"
    )
    parser.add_argument("--idle", type=float, default=30.0)
    parser.add_argument("--timeout", type=float, help="client timeout; default 3 x SLO")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--servers", default=DEFAULT_SERVERS)
    parser.add_argument("--out", type=Path, default=REPO / "results" / "goodput")
    parser.add_argument(
        "--profile",
        type=Path,
        default=PROFILE,
        help="server profile; configs/sim-h200-smollm2.yaml: GPU rates on the simulated H200",
    )
    parser.add_argument("--page", help="docs/benchmarks/<page>.md; default overload (overload-sim-h200)")
    args = parser.parse_args(argv)
    from llmserve.config import load_config

    args.model = load_config(args.profile).server.served_model_name
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    if args.capacity is not None and args.e2e_slo is None:
        parser.error("--capacity needs --e2e-slo")
    workdir = args.out / "logs"  # the servers' logs, kept for reading after the run
    workdir.mkdir(exist_ok=True)
    steps_ms: dict[str, float | None] = {}  # the step each llmserve server calibrated
    if args.capacity is None:
        capacity, full_batch_p50, steps_ms["capacity"] = measure_capacity(args, workdir)
    else:
        capacity, full_batch_p50 = args.capacity, args.e2e_slo / 2
    slo_s = args.e2e_slo or max(0.5, math.ceil(2 * full_batch_p50 * 2) / 2)
    args.timeout = args.timeout or 3 * slo_s
    print(
        f"capacity {capacity:.1f} req/s (e2e p50 {full_batch_p50:.2f} s at {args.clients} clients); "
        f"SLO e2e {slo_s:g} s",
        flush=True,
    )
    config = ("--config", str(args.profile))
    servers = {
        "vllm": ("vllm serve", lambda: start_vllm_serve(workdir / "vllm.log", args.profile)),
        "off": (
            "llmserve, no admission",
            lambda: start_server(workdir / "off.log", *config, "--set", "admission.enabled=false"),
        ),
        "slo": (
            f"llmserve, SLO admission (e2e {slo_s:g} s)",
            lambda: start_server(workdir / "slo.log", *config, "--set", f"slo.e2e_s={slo_s}"),
        ),
    }
    rows: list[Row] = []
    # The machine's speed can move within a run: the server without admission measures it again.
    capacity_after: float | None = None
    for key in args.servers.split(","):
        name, start = servers[key]
        server_rows, measured_again = run_server(name, start(), args, capacity, slo_s, steps_ms, key == "off")
        rows += server_rows
        capacity_after = measured_again if measured_again is not None else capacity_after
    mark_false_refusals(rows)
    report = table(rows)
    print(report)
    speeds = engine_speeds({name: ms for name, ms in steps_ms.items() if ms is not None})
    if speeds:
        print(speeds)
    (args.out / "goodput.json").write_text(
        json.dumps(
            {
                "capacity_rps": capacity,
                "capacity_after_rps": capacity_after,
                "calibrated_step_ms": steps_ms,
                "slo_e2e_s": slo_s,
                "rows": [asdict(r) for r in rows],
            },
            indent=2,
        )
    )
    plot(rows, capacity, args.out / "goodput.png")
    if args.capacity is not None or args.servers != DEFAULT_SERVERS:
        print(f"wrote {args.out}/goodput.json and goodput.png (a partial run: docs left as they are)")
        return 0
    simulated = args.profile.resolve() != PROFILE.resolve()
    page = args.page or (SIMULATED_PAGE if simulated else DEFAULT_PAGE)
    plot(rows, capacity, benchmark_image(f"{page}.png"))
    engine = (
        f"A SIMULATION ({args.profile}): "
        "vLLM's scheduler, KV cache, engine core and detokenizer run for real; the forward pass is a "
        "roofline model of an H200 (docs/simulated-gpu.md). The load generator (aiohttp), the API "
        "process and the engine core share this machine's cores.\n\n"
        if simulated
        else ""
    )
    burst_said = f", then {args.idle:g} s idle and a burst" if args.burst > 0 else ""
    body = (
        f"{engine}Capacity (llmserve without admission, {args.clients} clients back to back, "
        f"{args.capacity_duration:g} s): **{capacity:.1f} req/s**, "
        f"e2e p50 {full_batch_p50:.2f} s at that batch. "
        f"{capacity_drift(capacity, capacity_after)}"
        f"{speeds}"
        f"SLO: e2e <= **{slo_s:g} s** for completions of 16-96 prompt words and "
        f"{args.max_tokens[0]}-{args.max_tokens[1]} tokens (greedy, ignore_eos). Open-loop Poisson "
        f"arrivals for {args.duration:g} s per load{burst_said}; client timeout "
        f"{args.timeout:g} s. Goodput: requests answered within the SLO per second of arrivals"
        f"{' (for the burst: per second of SLO)' if args.burst > 0 else ''}.\n\n{report}"
    )
    command = f"python -m loadtest.goodput_bench {' '.join(argv or sys.argv[1:])}"
    if page in MAKE_TARGETS:  # a page of its own has no make target to name
        command = f"make {MAKE_TARGETS[page]}  # {command}"
    title = "at GPU rates on a simulated H200" if simulated else "on the CPU engine"
    title += f" ({args.duration:g} s per load)"
    published = publish(
        page,
        f"Goodput under overload {title}: vllm serve vs llmserve",
        command,
        body,
        images=(BENCHMARK_DOCS / f"{page}.png",),
    )
    print(f"wrote {args.out}/goodput.json, goodput.png and {published} ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
