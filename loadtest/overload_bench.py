"""The same overload, with admission control (shedding) on and off, side by side in one run.

    python -m loadtest.overload_bench --rate 8 --duration 30

For each setting it starts a real server (real vLLM), offers open-loop Poisson arrivals at
--rate requests/s for --duration seconds (seeded prompt and output lengths), waits for every
answer, and prints: admitted and refused counts, latency of admitted requests (p50/p99) and how
fast refusals came back. Loopback only; bounded in count and time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from loadtest.bench_driver import percentile
from loadtest.report import publish
from loadtest.server_process import start_server
from loadtest.workload import seeded_prompt

SETTINGS = {
    # max_in_flight stays at the profile's 64 (= vLLM's max_num_seqs): fewer would starve batching.
    "shedding on": [
        "--set", "admission.max_waiting=32",
        "--set", "admission.queue_timeout_s=5",
    ],
    "shedding off": ["--set", "admission.enabled=false"],
}  # fmt: skip


@dataclass
class Outcome:
    status: int
    latency_s: float


@dataclass
class Summary:
    setting: str
    offered: int
    admitted_ok: int
    refused_429: int
    other: int
    admitted_p50_s: float
    admitted_p99_s: float
    refusal_p50_ms: float
    refusal_p99_ms: float
    goodput_rps: float


async def offer_load(
    base_url: str, rate: float, duration_s: float, seed: int, timeout_s: float
) -> list[Outcome]:
    rng = random.Random(seed)
    outcomes: list[Outcome] = []

    async def one(client: httpx.AsyncClient, prompt: str, max_tokens: int) -> None:
        started = time.perf_counter()
        body = {
            "model": "SmolLM2-135M-Instruct",
            "prompt": prompt,
            "max_tokens": max_tokens,
            "ignore_eos": True,
        }
        try:
            response = await client.post("/v1/completions", json=body)
            status = response.status_code
        except httpx.HTTPError:
            status = 0
        outcomes.append(Outcome(status, time.perf_counter() - started))

    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout_s, limits=limits) as client:
        tasks = []
        started = time.monotonic()
        next_at = 0.0
        while next_at < duration_s:
            await asyncio.sleep(max(0.0, started + next_at - time.monotonic()))
            prompt = seeded_prompt(rng, 8, 64)
            tasks.append(asyncio.create_task(one(client, prompt, rng.randint(16, 48))))
            next_at += rng.expovariate(rate)
        await asyncio.gather(*tasks)
    return outcomes


def summarise(setting: str, outcomes: list[Outcome], elapsed_s: float) -> Summary:
    ok = [o.latency_s for o in outcomes if o.status == 200]
    refused = [o.latency_s * 1000 for o in outcomes if o.status == 429]
    return Summary(
        setting=setting,
        offered=len(outcomes),
        admitted_ok=len(ok),
        refused_429=len(refused),
        other=len(outcomes) - len(ok) - len(refused),
        admitted_p50_s=percentile(ok, 50),
        admitted_p99_s=percentile(ok, 99),
        refusal_p50_ms=percentile(refused, 50),
        refusal_p99_ms=percentile(refused, 99),
        goodput_rps=len(ok) / elapsed_s,
    )


def run_setting(setting: str, args: argparse.Namespace, workdir: Path) -> Summary:
    server = start_server(workdir / f"{setting.replace(' ', '-')}.log", *SETTINGS[setting])
    try:
        server.wait_ready(300)
        print(f"[{setting}] server ready; offering {args.rate} req/s for {args.duration:.0f} s", flush=True)
        started = time.monotonic()
        outcomes = asyncio.run(offer_load(server.base_url, args.rate, args.duration, args.seed, args.timeout))
        return summarise(setting, outcomes, time.monotonic() - started)
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=float, default=8.0, help="offered requests per second (Poisson)")
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--timeout", type=float, default=300.0, help="client timeout per request")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("results/overload.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        summaries = [run_setting(setting, args, Path(workdir)) for setting in SETTINGS]
    header = (
        f"{'setting':14} {'offered':>7} {'ok':>5} {'429':>5} {'other':>5} "
        f"{'ok p50 s':>9} {'ok p99 s':>9} {'429 p50 ms':>10} {'429 p99 ms':>10} {'goodput/s':>9}"
    )
    print(header)
    for s in summaries:
        print(
            f"{s.setting:14} {s.offered:7d} {s.admitted_ok:5d} {s.refused_429:5d} {s.other:5d} "
            f"{s.admitted_p50_s:9.2f} {s.admitted_p99_s:9.2f} {s.refusal_p50_ms:10.1f} "
            f"{s.refusal_p99_ms:10.1f} {s.goodput_rps:9.2f}"
        )
    on, off = summaries
    ratio = f"admitted p99 with shedding / without: {on.admitted_p99_s / off.admitted_p99_s:.2f}x"
    print(ratio)
    rows = [
        "| setting | offered | 200 | 429 | admitted p50 s | admitted p99 s | 429 p50 ms | 429 p99 ms "
        "| goodput req/s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        *(
            f"| {s.setting} | {s.offered} | {s.admitted_ok} | {s.refused_429} | {s.admitted_p50_s:.2f} | "
            f"{s.admitted_p99_s:.2f} | {s.refusal_p50_ms:.0f} | {s.refusal_p99_ms:.0f} "
            f"| {s.goodput_rps:.2f} |"
            for s in summaries
        ),
    ]
    workload = f"Seeded Poisson arrivals at {args.rate:g} req/s for {args.duration:g} s (seed {args.seed})."
    command = f"make bench-overload  # python -m loadtest.overload_bench {' '.join(sys.argv[1:])}"
    body = "\n".join([workload, "", *rows, "", ratio])
    print(f"wrote {publish('overload', 'Overload: admission on and off', command, body)}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {"args": vars(args) | {"out": str(args.out)}, "results": [asdict(s) for s in summaries]}, indent=2
        )
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
