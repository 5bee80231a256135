"""Engine benchmark: the transformers static-batching baseline, vLLM, and vLLM with ngram speculation,
on the same seeded workloads, offline (engine in-process) and online (through the HTTP gateway).

    python -m loadtest.engine_bench --out results/bench        (what `make bench` runs)

Prints one table with every figure as a ratio to the baseline, the gateway's overhead
(online / offline throughput, added p50 latency), speculation's speed-up at concurrency 1 and 16,
and prefix caching's TTFT, and writes bench.json, bench.md and bench.png. Each offline engine
runs in its own process (clean peak-memory figures); each online one is a real server on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from loadtest.bench_driver import RunStats, drive, engine_sender, http_sender
from loadtest.report import BENCHMARK_DOCS, benchmark_image, benchmark_parser, machine_description, publish
from loadtest.server_process import REPO, start_server, tree_rss_bytes
from loadtest.workload import Workload, offline_batch, poisson_arrivals, repetitive_text, shared_system_prompt


@dataclass(frozen=True)
class Variant:
    description: str
    profile: str
    overrides: tuple[str, ...]
    workloads: tuple[str, ...]


BASELINE = "baseline"
SPEEDUP_WORKLOADS = ("batch", "poisson", "repetitive-c1", "repetitive-c16")
VARIANTS = {
    BASELINE: Variant(
        "transformers generate(), static batching", "configs/cpu-smollm2.yaml",
        ("engine.backend=transformers",), SPEEDUP_WORKLOADS,
    ),
    "vllm": Variant(
        "vLLM continuous batching, paged KV", "configs/cpu-smollm2.yaml", (),
        (*SPEEDUP_WORKLOADS, "shared-prefix"),
    ),
    "vllm-ngram": Variant(
        "vLLM + ngram speculation (4 tokens)", "configs/cpu-smollm2-spec-ngram.yaml",
        ("engine.max_num_seqs=64", "admission.max_in_flight=64"), SPEEDUP_WORKLOADS,
    ),
    "vllm-no-prefix-cache": Variant(
        "vLLM, prefix caching off", "configs/cpu-smollm2.yaml",
        ("engine.enable_prefix_caching=false",), ("shared-prefix",),
    ),
}  # fmt: skip


def build_workloads(scale: float, seed: int) -> dict[str, Workload]:
    def n(count: int) -> int:
        return max(2, round(count * scale))

    return {
        "batch": offline_batch(n(64), prompt_words=48, max_tokens=64, seed=seed),
        "poisson": poisson_arrivals(n(48), rate_per_s=2.0, seed=seed),
        "repetitive-c1": repetitive_text(n(6), concurrency=1, max_tokens=96, seed=seed),
        "repetitive-c16": repetitive_text(n(32), concurrency=16, max_tokens=96, seed=seed),
        "shared-prefix": shared_system_prompt(n(12), max_tokens=8, seed=seed),
    }


def load_variant_config(variant: Variant) -> Any:
    from llmserve.config import load_config, parse_overrides

    return load_config(REPO / variant.profile, parse_overrides(list(variant.overrides)))


# ---- offline: one engine in this (worker) process ------------------------------------------


async def run_offline_worker(variant_name: str, scale: float, seed: int) -> list[dict[str, Any]]:
    from llmserve.engine import start_engine
    from llmserve.engine.vllm_engine import apply_process_environment

    variant = VARIANTS[variant_name]
    config = load_variant_config(variant)
    apply_process_environment(config.engine)
    workloads = build_workloads(scale, seed)
    results = []
    async with start_engine(config) as engine:
        send = engine_sender(engine)
        await drive(offline_batch(2, 8, 4, seed=seed + 1), send, "warm-up")
        for name in variant.workloads:
            stats = await drive(workloads[name], send, f"offline {variant_name}")
            results.append({"workload_key": name, **stats.as_dict()})
    return results


class TreeMemorySampler(threading.Thread):
    """Peak resident memory of a process and all its children, sampled every 200 ms."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak_bytes, self._done = pid, 0, threading.Event()

    def run(self) -> None:
        while not self._done.wait(0.2):
            with contextlib.suppress(psutil.Error):
                self.peak_bytes = max(self.peak_bytes, tree_rss_bytes(self.pid))

    def stop(self) -> int:
        self._done.set()
        self.join()
        return self.peak_bytes


def run_offline(variant_name: str, scale: float, seed: int, workdir: Path) -> list[dict[str, Any]]:
    out = workdir / f"offline-{variant_name}.json"
    command = [sys.executable, "-m", "loadtest.engine_bench", "--worker", variant_name,
               "--scale", str(scale), "--seed", str(seed), "--out", str(out)]  # fmt: skip
    print(f"[offline] {variant_name}: starting the engine in a worker process", file=sys.stderr)
    with (workdir / f"offline-{variant_name}.log").open("wb") as log:
        process = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        sampler = TreeMemorySampler(process.pid)
        sampler.start()
        code = process.wait()
        peak = sampler.stop()
    if code != 0:
        raise RuntimeError(f"offline worker {variant_name} failed ({code}); see {workdir}")
    rows: list[dict[str, Any]] = json.loads(out.read_text())
    return [{**row, "mode": "offline", "variant": variant_name, "peak_rss_mib": peak / 2**20} for row in rows]


# ---- online: a real server per variant -----------------------------------------------------


async def _drive_online(
    base_url: str, variant: Variant, workloads: dict[str, Workload], label: str
) -> list[Any]:
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        send = http_sender(client, base_url)
        results = []
        for name in variant.workloads:
            stats: RunStats = await drive(workloads[name], send, label)
            results.append({"workload_key": name, **stats.as_dict()})
        return results


def run_online(variant_name: str, scale: float, seed: int, workdir: Path) -> list[dict[str, Any]]:
    variant = VARIANTS[variant_name]
    args = ["--config", variant.profile]
    for override in variant.overrides:
        args += ["--set", override]
    print(f"[online] {variant_name}: starting a server", file=sys.stderr)
    server = start_server(workdir / f"online-{variant_name}.log", *args)
    try:
        server.wait_ready(600)
        sampler = TreeMemorySampler(server.process.pid)
        sampler.start()
        rows = asyncio.run(
            _drive_online(server.base_url, variant, build_workloads(scale, seed), f"online {variant_name}")
        )
        peak = sampler.stop()
    finally:
        server.stop()
    return [{**row, "mode": "online", "variant": variant_name, "peak_rss_mib": peak / 2**20} for row in rows]


# ---- report ----------------------------------------------------------------------------------


def find(rows: list[dict[str, Any]], mode: str, variant: str, workload: str) -> dict[str, Any] | None:
    for row in rows:
        if (row["mode"], row["variant"], row["workload_key"]) == (mode, variant, workload):
            return row
    return None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def derive(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Every ratio the docs quote, computed from rows of the same run."""
    for row in rows:
        base = find(rows, row["mode"], BASELINE, row["workload_key"])
        row["tok_s_vs_baseline"] = ratio(
            row["output_tokens_per_s"], base["output_tokens_per_s"] if base else None
        )
        row["p99_vs_baseline"] = ratio(row["e2e_p99_s"], base["e2e_p99_s"] if base else None)
    gateway = []
    for row in rows:
        offline = find(rows, "offline", row["variant"], row["workload_key"])
        if row["mode"] == "online" and offline:
            gateway.append({
                "variant": row["variant"], "workload": row["workload_key"],
                "online_over_offline_tok_s":
                    ratio(row["output_tokens_per_s"], offline["output_tokens_per_s"]),
                "added_p50_ms": (row["e2e_p50_s"] - offline["e2e_p50_s"]) * 1000,
            })  # fmt: skip
    speculation = []
    for mode in ("offline", "online"):
        for workload in SPEEDUP_WORKLOADS:
            spec, plain = find(rows, mode, "vllm-ngram", workload), find(rows, mode, "vllm", workload)
            if spec and plain:
                speculation.append({
                    "mode": mode, "workload": workload,
                    "speedup_tok_s": ratio(spec["output_tokens_per_s"], plain["output_tokens_per_s"]),
                })  # fmt: skip
    prefix = []
    for mode in ("offline", "online"):
        cached, uncached = (
            find(rows, mode, "vllm", "shared-prefix"),
            find(rows, mode, "vllm-no-prefix-cache", "shared-prefix"),
        )
        if cached and uncached:
            prefix.append({
                "mode": mode, "ttft_p50_ms_cached": cached["ttft_p50_s"] * 1000,
                "ttft_p50_ms_uncached": uncached["ttft_p50_s"] * 1000,
                "ttft_ratio": ratio(cached["ttft_p50_s"], uncached["ttft_p50_s"]),
            })  # fmt: skip
    return {"gateway_overhead": gateway, "speculation": speculation, "prefix_caching": prefix}


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None or value != value else format(value, spec)


def markdown(rows: list[dict[str, Any]], derived: dict[str, Any], machine: str) -> str:
    lines = [f"Machine: {machine}", "",
             "| mode | engine | workload | req/s | out tok/s | x baseline | p50 e2e s | p99 e2e s | "
             "TTFT p50 s | TTFT p99 s | peak RSS MiB | failures |",
             "| --- | --- | --- |" + " ---: |" * 9]  # fmt: skip
    for r in rows:
        lines.append(
            f"| {r['mode']} | {r['variant']} | {r['workload']} | {_fmt(r['requests_per_s'], '.2f')} | "
            f"{_fmt(r['output_tokens_per_s'], '.0f')} | {_fmt(r['tok_s_vs_baseline'], '.2f')} | "
            f"{_fmt(r['e2e_p50_s'], '.2f')} | {_fmt(r['e2e_p99_s'], '.2f')} | "
            f"{_fmt(r['ttft_p50_s'], '.3f')} | "
            f"{_fmt(r['ttft_p99_s'], '.3f')} | {_fmt(r['peak_rss_mib'], '.0f')} | {r['failures']} |"
        )
    lines += [
        "",
        "Gateway overhead (same engine, online / offline):",
        "",
        "| engine | workload | online/offline tok/s | added p50 ms |",
        "| --- | --- | ---: | ---: |",
    ]
    for g in derived["gateway_overhead"]:
        lines.append(f"| {g['variant']} | {g['workload']} | {_fmt(g['online_over_offline_tok_s'], '.2f')} | "
                     f"{_fmt(g['added_p50_ms'], '.0f')} |")  # fmt: skip
    lines += [
        "",
        "ngram speculation, speed-up over plain vLLM (output tok/s):",
        "",
        "| mode | workload | speed-up |",
        "| --- | --- | ---: |",
    ]
    for s in derived["speculation"]:
        lines.append(f"| {s['mode']} | {s['workload']} | {_fmt(s['speedup_tok_s'], '.2f')}x |")
    lines += [
        "",
        "Prefix caching (shared ~700-token prefix, one at a time):",
        "",
        "| mode | TTFT p50 cached ms | TTFT p50 uncached ms | ratio |",
        "| --- | ---: | ---: | ---: |",
    ]
    for p in derived["prefix_caching"]:
        lines.append(f"| {p['mode']} | {_fmt(p['ttft_p50_ms_cached'], '.0f')} | "
                     f"{_fmt(p['ttft_p50_ms_uncached'], '.0f')} | "
                     f"{_fmt(p['ttft_ratio'], '.2f')} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for axis, mode in zip(axes, ("offline", "online"), strict=True):
        variants = [v for v in VARIANTS if v != "vllm-no-prefix-cache"]
        width = 0.8 / len(variants)
        for i, variant in enumerate(variants):
            values = [
                (find(rows, mode, variant, w) or {}).get("output_tokens_per_s", 0.0)
                for w in SPEEDUP_WORKLOADS
            ]
            positions = [x + i * width for x in range(len(SPEEDUP_WORKLOADS))]
            axis.bar(positions, values, width, label=variant)
        axis.set_xticks([x + width for x in range(len(SPEEDUP_WORKLOADS))], SPEEDUP_WORKLOADS)
        axis.set_ylabel("output tokens/s")
        axis.set_title(f"{mode}: output tokens/s (same requests, greedy, same lengths)")
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__, REPO / "results" / "bench", VARIANTS)
    parser.add_argument("--modes", default="offline,online")
    args = parser.parse_args(argv)
    if args.worker:
        rows = asyncio.run(run_offline_worker(args.worker, args.scale, args.seed))
        args.out.write_text(json.dumps(rows))
        return 0

    args.out.mkdir(parents=True, exist_ok=True)
    variants = [v for v in args.variants.split(",") if v]
    modes = args.modes.split(",")
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="llmserve-bench-") as tmp:
        workdir = Path(tmp)
        for variant in variants:
            if "offline" in modes:
                rows += run_offline(variant, args.scale, args.seed, workdir)
            if "online" in modes:
                rows += run_online(variant, args.scale, args.seed, workdir)
    derived = derive(rows)
    machine = machine_description()
    report = markdown(rows, derived, machine)
    print(report)
    workloads = {k: w.description for k, w in build_workloads(args.scale, args.seed).items()}
    (args.out / "bench.json").write_text(json.dumps({
        "command": " ".join(["python -m loadtest.engine_bench", *(sys.argv[1:] if argv is None else argv)]),
        "machine": machine, "elapsed_s": time.monotonic() - started, "workloads": workloads,
        "variants": {k: v.description for k, v in VARIANTS.items()}, "rows": rows, **derived,
    }, indent=2))  # fmt: skip
    (args.out / "bench.md").write_text(report)
    plot(rows, args.out / "bench.png")
    plot(rows, benchmark_image("engines.png"))
    command = " ".join(
        ["make bench  # python -m loadtest.engine_bench", *(sys.argv[1:] if argv is None else argv)]
    )
    published = publish("engines", "Engines side by side: static batching, vLLM, vLLM + ngram", command,
                        report, images=(BENCHMARK_DOCS / "engines.png",))  # fmt: skip
    elapsed = time.monotonic() - started
    print(f"wrote {args.out}/bench.json, bench.md, bench.png and {published} ({elapsed:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
