"""Render the dashboard's key panels from live /metrics scrapes into a PNG (no Grafana needed).

    python -m loadtest.dashboard_png --url http://127.0.0.1:8000 --duration 60 --load 8

Scrapes every --interval seconds for --duration seconds while --load concurrent clients send a
seeded mix of requests (completions, streams, chat, a few invalid ones) to the same server, then
plots what Prometheus + Grafana would show. It also reports what each scrape cost.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from loadtest.prom import Scrape, bucket_deltas, delta, histogram_quantile
from loadtest.workload import seeded_prompt

SLO_S = 0.2
GENERATION_ROUTES = ("/v1/completions", "/v1/chat/completions")


@dataclass
class Sample:
    at: float
    scrape: Scrape
    cost_s: float
    health_s: float


async def scrape_loop(client: httpx.AsyncClient, duration_s: float, interval_s: float) -> list[Sample]:
    samples: list[Sample] = []
    started = time.monotonic()
    while time.monotonic() - started <= duration_s:
        begin = time.perf_counter()
        await client.get("/health")  # the same loop's latency for a trivial route, for comparison
        health = time.perf_counter() - begin
        begin = time.perf_counter()
        response = await client.get("/metrics")
        cost = time.perf_counter() - begin
        samples.append(Sample(time.monotonic() - started, Scrape.parse(response.text), cost, health))
        await asyncio.sleep(max(0.0, interval_s - cost))
    return samples


async def load_worker(client: httpx.AsyncClient, model: str, seed: int, stop_at: float) -> None:
    rng = random.Random(seed)
    while time.monotonic() < stop_at:
        prompt = seeded_prompt(rng, 4, 40)
        max_tokens = rng.randint(4, 48)
        kind = rng.random()
        try:
            if kind < 0.05:  # an invalid request, so the error panel has something to show
                await client.post("/v1/completions", json={"model": model, "prompt": prompt, "top_p": 7})
            elif kind < 0.45:
                body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": kind < 0.25}
                async with client.stream("POST", "/v1/completions", json=body) as response:
                    await response.aread()
            else:
                messages = [{"role": "user", "content": prompt}]
                body = {"model": model, "messages": messages, "max_tokens": max_tokens, "stream": kind > 0.7}
                async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                    await response.aread()
        except httpx.HTTPError:
            await asyncio.sleep(0.1)


def rate(after: Sample, before: Sample, name: str, **labels: str) -> float:
    return delta(after.scrape, before.scrape, name, **labels) / max(after.at - before.at, 1e-9)


def quantile_series(samples: list[Sample], name: str, quantile: float, window: int) -> list[float | None]:
    values: list[float | None] = []
    for index in range(1, len(samples)):
        before = samples[max(0, index - window)]
        values.append(histogram_quantile(quantile, bucket_deltas(samples[index].scrape, before.scrape, name)))
    return values


def render(samples: list[Sample], out: Path, title: str, window: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    times = [sample.at for sample in samples[1:]]
    pairs = list(zip(samples[1:], samples[:-1], strict=True))
    figure, axes = plt.subplots(4, 2, figsize=(14, 14), constrained_layout=True)
    figure.suptitle(title)

    def latency_panel(axis, name: str, label: str) -> None:  # type: ignore[no-untyped-def]
        for quantile in (0.5, 0.95, 0.99):
            series = quantile_series(samples, name, quantile, window)
            axis.plot(
                times, [v if v is not None else float("nan") for v in series], label=f"p{int(quantile * 100)}"
            )
        axis.axhline(SLO_S, color="red", linestyle="--", label="SLO 200 ms")
        axis.set_title(label)
        axis.set_ylabel("seconds")
        axis.set_yscale("log")

    ok = [
        sum(rate(a, b, "llmserve_requests_total", route=r, status="200") for r in GENERATION_ROUTES)
        for a, b in pairs
    ]
    all_requests = [
        sum(rate(a, b, "llmserve_requests_total", route=r) for r in GENERATION_ROUTES) for a, b in pairs
    ]
    axes[0][0].plot(times, all_requests, label="all")
    axes[0][0].plot(times, ok, label="200")
    axes[0][0].set_title("Generation requests per second")
    errors = [rate(a, b, "llmserve_request_errors_total") for a, b in pairs]
    rejections = [rate(a, b, "llmserve_rejections_total") for a, b in pairs]
    axes[0][1].plot(times, errors, label="errors (all codes)")
    axes[0][1].plot(times, rejections, label="rejections (all reasons)")
    axes[0][1].set_title("Errors and rejections per second")
    latency_panel(axes[1][0], "llmserve_e2e_request_latency_seconds", "End-to-end latency")
    latency_panel(axes[1][1], "llmserve_time_to_first_token_seconds", "Time to first token")
    latency_panel(axes[2][0], "llmserve_time_per_output_token_seconds", "Time per output token")
    axes[2][1].plot(
        times, [s.scrape.value("vllm:num_requests_waiting") for s in samples[1:]], label="engine waiting"
    )
    axes[2][1].plot(
        times, [s.scrape.value("vllm:num_requests_running") for s in samples[1:]], label="engine running"
    )
    axes[2][1].plot(
        times, [s.scrape.value("llmserve_requests_in_flight") for s in samples[1:]], label="gateway in flight"
    )
    axes[2][1].set_title("Queue depth")
    axes[3][0].plot(
        times, [s.scrape.value("vllm:kv_cache_usage_perc") for s in samples[1:]], label="KV cache used"
    )
    hit_rates = []
    for after, before in pairs:
        queries = delta(after.scrape, before.scrape, "vllm:prefix_cache_queries_total")
        hit_rates.append(
            delta(after.scrape, before.scrape, "vllm:prefix_cache_hits_total") / queries
            if queries
            else float("nan")
        )
    axes[3][0].plot(times, hit_rates, label="prefix cache hit rate")
    axes[3][0].set_ylim(0, 1)
    axes[3][0].set_title("KV cache usage and prefix cache hit rate")
    acceptance = []
    for after, before in pairs:
        drafted = delta(after.scrape, before.scrape, "vllm:spec_decode_num_draft_tokens_total")
        accepted = delta(after.scrape, before.scrape, "vllm:spec_decode_num_accepted_tokens_total")
        acceptance.append(accepted / drafted if drafted else float("nan"))
    axes[3][1].plot(times, acceptance, label="spec-decode acceptance")
    axes[3][1].plot(
        times,
        [rate(a, b, "llmserve_generation_tokens_total") / 1000 for a, b in pairs],
        label="generated ktok/s",
    )
    axes[3][1].set_title("Speculative decoding acceptance (empty without a draft) and ktok/s")
    for row in axes:
        for axis in row:
            axis.set_xlabel("seconds")
            axis.grid(alpha=0.3)
            axis.legend(loc="upper left", fontsize="small")
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=80)


async def run(args: argparse.Namespace) -> list[Sample]:
    limits = httpx.Limits(max_connections=args.load + 4)
    async with httpx.AsyncClient(base_url=args.url, timeout=120, limits=limits) as client:
        stop_at = time.monotonic() + args.duration
        workers = [load_worker(client, args.model, args.seed + i, stop_at) for i in range(args.load)]
        samples, *_ = await asyncio.gather(scrape_loop(client, args.duration, args.interval), *workers)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--window", type=int, default=5, help="scrapes per rate/quantile window")
    parser.add_argument("--load", type=int, default=8, help="concurrent clients (0: only observe)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("results/dashboard.png"))
    args = parser.parse_args()
    if httpx.URL(args.url).host not in ("127.0.0.1", "localhost", "::1"):
        parser.error("the load this script sends is for a server on this machine (loopback) only")
    samples = asyncio.run(run(args))
    title = f"llmserve at {args.url}: {args.load} clients, {args.duration:.0f} s"
    render(samples, args.out, title, args.window)
    print(f"wrote {args.out} from {len(samples)} scrapes")
    for route, values in (
        ("/metrics", [s.cost_s for s in samples]),
        ("/health", [s.health_s for s in samples]),
    ):
        print(f"{route:9} under load: {describe_ms(values)}")


def describe_ms(values_s: list[float]) -> str:
    values = sorted(value * 1000 for value in values_s)
    p99 = values[min(len(values) - 1, int(0.99 * len(values)))]
    return (
        f"p50 {statistics.median(values):.1f} ms, p99 {p99:.1f} ms, max {values[-1]:.1f} ms (n={len(values)})"
    )


if __name__ == "__main__":
    main()
