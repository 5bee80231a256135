"""Speculative decoding against plain vLLM, side by side in one run: where does it pay, where does it cost?

    python -m loadtest.spec_bench --out results/spec        (what `make bench-spec` runs)

Each configuration runs as an engine in a worker process of its own (the same engine the server
runs, no HTTP), on two seeded workloads, repetitive (copy text from the prompt: where drafts are
accepted) and open-ended (where they mostly are not), at 1 to 64 concurrent greedy streams of
fixed length (`ignore_eos`). Per configuration and concurrency: output tok/s, TPOT p50/p99, their
ratios to plain vLLM, and vLLM's own acceptance counters (`vllm:spec_decode_*`). From the static
ngram configurations it derives the batch-size schedule (`num_speculative_tokens_per_batch_size`)
that keeps every concurrency at least as fast as plain decoding, and measures the one the profile
ships. Writes spec.json here and docs/benchmarks/spec.md + spec.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest.bench_driver import drive, engine_sender
from loadtest.report import BENCHMARK_DOCS, benchmark_image, benchmark_parser, machine_description, publish
from loadtest.server_process import REPO
from loadtest.workload import Workload, offline_batch, open_ended_text, repetitive_text

PLAIN = "plain"
NGRAM_PROFILE = "configs/cpu-smollm2-spec-ngram.yaml"
STATIC = ("engine.speculative.num_speculative_tokens_per_batch_size=null",)
OFF = ("engine.speculative.num_speculative_tokens_per_batch_size=[[1,64,0]]",)
CONCURRENCY = (1, 2, 4, 8, 16, 32, 64)
WORKLOADS = ("repetitive", "open-ended")
OUTPUT_TOKENS = 64
# Speculation must never cost more than this (ratio of output tok/s to plain vLLM).
NO_SLOWDOWN = 0.95
# A schedule entry speculates only where both workloads kept this margin over that line.
SCHEDULE_MARGIN = 0.98


@dataclass(frozen=True)
class Variant:
    description: str
    profile: str
    overrides: tuple[str, ...] = ()
    static_tokens: int | None = None  # drafts this many tokens at every batch size


VARIANTS = {
    PLAIN: Variant("vLLM, no speculation", "configs/cpu-smollm2.yaml"),
    "ngram-k0": Variant("ngram configured, 0 tokens at every batch size (the schedule's off switch)",
                        NGRAM_PROFILE, ("engine.speculative.num_speculative_tokens=2", *OFF), 0),
    "ngram-k2": Variant("ngram, 2 tokens at every batch size", NGRAM_PROFILE,
                        ("engine.speculative.num_speculative_tokens=2", *STATIC), 2),
    "ngram-k4": Variant("ngram, 4 tokens at every batch size", NGRAM_PROFILE,
                        ("engine.speculative.num_speculative_tokens=4", *STATIC), 4),
    "ngram-k8": Variant("ngram, 8 tokens at every batch size", NGRAM_PROFILE,
                        ("engine.speculative.num_speculative_tokens=8", *STATIC), 8),
    "ngram-dynamic": Variant("ngram, the batch-size schedule this run derives from the static rows",
                             NGRAM_PROFILE),
    "suffix": Variant("suffix decoding (Arctic Inference)", "configs/cpu-smollm2-spec-suffix.yaml"),
}  # fmt: skip
SAME_BATCHING = ("engine.max_num_seqs=64",)  # every configuration may batch all 64 streams


def build_workloads(scale: float, seed: int) -> dict[tuple[str, int], Workload]:
    workloads = {}
    for concurrency in CONCURRENCY:
        count = max(2, round(max(8, 2 * concurrency) * scale), concurrency)
        # Prompts new to each level: suffix decoding caches earlier responses, and a prompt seen at
        # the previous level would be answered from that cache.
        level_seed = seed * 1000 + concurrency
        workloads["repetitive", concurrency] = repetitive_text(count, concurrency, OUTPUT_TOKENS, level_seed)
        workloads["open-ended", concurrency] = open_ended_text(count, concurrency, OUTPUT_TOKENS, level_seed)
    return workloads


def spec_decode_counters() -> dict[str, float]:
    """vLLM's speculative-decoding counters in this process (its Prometheus stat logger's)."""
    from prometheus_client import REGISTRY

    totals = {"drafts": 0.0, "draft_tokens": 0.0, "accepted_tokens": 0.0}
    for family in REGISTRY.collect():
        for sample in family.samples:
            for key in totals:
                if sample.name == f"vllm:spec_decode_num_{key}_total":
                    totals[key] += sample.value
    return totals


async def run_worker(
    variant_name: str, scale: float, seed: int, extra: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    from llmserve.config import load_config, parse_overrides
    from llmserve.engine import start_engine
    from llmserve.engine.vllm_engine import apply_process_environment

    variant = VARIANTS[variant_name]
    overrides = parse_overrides([*SAME_BATCHING, *variant.overrides, *extra])
    config = load_config(REPO / variant.profile, overrides)
    apply_process_environment(config.engine)
    rows = []
    async with start_engine(config) as engine:
        send = engine_sender(engine)
        await drive(offline_batch(4, 8, 8, seed=seed + 1), send, "warm-up")
        for (workload, concurrency), shapes in build_workloads(scale, seed).items():
            before = spec_decode_counters()
            stats = await drive(shapes, send, f"{variant_name}")
            after = spec_decode_counters()
            delta = {key: after[key] - before[key] for key in after}
            rows.append({
                **stats.as_dict(),
                "variant": variant_name, "workload": workload, "concurrency": concurrency,
                "acceptance_rate": delta["accepted_tokens"] / delta["draft_tokens"]
                if delta["draft_tokens"] else None,
                "mean_accepted_length": 1 + delta["accepted_tokens"] / delta["drafts"]
                if delta["drafts"] else None,
            })  # fmt: skip
    speculative = config.engine.speculative
    schedule = speculative.num_speculative_tokens_per_batch_size if speculative else None
    return [{**row, "schedule": schedule} for row in rows]


def run_variant(
    variant_name: str, scale: float, seed: int, workdir: Path, extra: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    out = workdir / f"{variant_name}.json"
    command = [sys.executable, "-m", "loadtest.spec_bench", "--worker", variant_name,
               "--scale", str(scale), "--seed", str(seed), "--out", str(out),
               *(arg for override in extra for arg in ("--set", override))]  # fmt: skip
    print(f"[spec] {variant_name}: {VARIANTS[variant_name].description}", file=sys.stderr)
    log = workdir / f"{variant_name}.log"
    with log.open("wb") as sink:
        code = subprocess.run(command, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT).returncode
    if code != 0:
        print(log.read_text()[-4000:], file=sys.stderr)
        raise RuntimeError(f"worker {variant_name} failed ({code})")
    rows: list[dict[str, Any]] = json.loads(out.read_text())
    return rows


# ---- analysis --------------------------------------------------------------------------------


def find(rows: list[dict[str, Any]], variant: str, workload: str, concurrency: int) -> dict[str, Any] | None:
    for row in rows:
        if (row["variant"], row["workload"], row["concurrency"]) == (variant, workload, concurrency):
            return row
    return None


def add_ratios(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        plain = find(rows, PLAIN, row["workload"], row["concurrency"])
        for key in ("output_tokens_per_s", "tpot_p50_s", "tpot_p99_s"):
            row[f"{key}_vs_plain"] = row[key] / plain[key] if plain and plain[key] else None


def derive_schedule(rows: list[dict[str, Any]]) -> list[list[int]]:
    """Per measured concurrency, among the static ngram token counts: where some keep both
    workloads >= SCHEDULE_MARGIN x plain, the one with the best repetitive speed-up; where none
    does, the one whose worse workload is fastest (least harm, whatever the traffic). 0 tokens is
    a candidate like the others, measured as the configuration drafting nothing: in vLLM 0.32 it
    is not plain vLLM (speculation turns async scheduling off). Then ranges (previous
    concurrency, this one], merged where the token counts agree."""
    picks: list[tuple[int, int]] = []
    for concurrency in CONCURRENCY:
        candidates: list[tuple[float, float, int]] = []  # (worse ratio, repetitive ratio, tokens)
        for name, variant in VARIANTS.items():
            if variant.static_tokens is None or not name.startswith("ngram"):
                continue
            measured = [find(rows, name, workload, concurrency) for workload in WORKLOADS]
            ratios = [row["output_tokens_per_s_vs_plain"] if row else None for row in measured]
            if any(r is None for r in ratios):
                continue
            candidates.append((min(ratios), ratios[0], variant.static_tokens))
        harmless = [c for c in candidates if c[0] >= SCHEDULE_MARGIN]
        if harmless:
            tokens = max(harmless, key=lambda c: (c[1], c[0]))[2]
        elif candidates:
            tokens = max(candidates, key=lambda c: (c[0], c[1]))[2]
        else:
            tokens = 0
        picks.append((concurrency, tokens))
    schedule: list[list[int]] = []
    start = 1
    for concurrency, tokens in picks:
        if schedule and schedule[-1][2] == tokens:
            schedule[-1][1] = concurrency
        else:
            schedule.append([start, concurrency, tokens])
        start = concurrency + 1
    return schedule


def summary(rows: list[dict[str, Any]], variants: list[str]) -> list[dict[str, Any]]:
    out = []
    for variant in variants:
        if variant == PLAIN:
            continue
        single = find(rows, variant, "repetitive", 1)
        worst = {
            workload: min(
                (r["output_tokens_per_s_vs_plain"] for r in rows
                 if r["variant"] == variant and r["workload"] == workload
                 and r["output_tokens_per_s_vs_plain"] is not None),
                default=None,
            )
            for workload in WORKLOADS
        }  # fmt: skip
        one_stream = single["output_tokens_per_s_vs_plain"] if single else None
        out.append({
            "variant": variant,
            "repetitive_c1": one_stream,
            "worst_repetitive": worst["repetitive"],
            "worst_open_ended": worst["open-ended"],
            "meets_targets": one_stream is not None and one_stream >= 2.0
            and all(w is not None and w >= NO_SLOWDOWN for w in worst.values()),
        })  # fmt: skip
    return out


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None or value != value else format(value, spec)


def markdown(rows: list[dict[str, Any]], variants: list[str], derived: list[list[int]], scale: float) -> str:
    lines = [
        "Greedy, `ignore_eos`, "
        f"{OUTPUT_TOKENS} tokens out per request; at each concurrency c, max(8, 2c) x {scale:g} requests "
        "by c clients back to back; every configuration batches up to 64 sequences. "
        "Ratios are to plain vLLM at the same workload and concurrency, measured in this run.",
        "",
        "| configuration | what it is |",
        "| --- | --- |",
        *(f"| {name} | {VARIANTS[name].description} |" for name in variants),
        "",
        f"Targets: >= 2x output tok/s on one repetitive stream; >= {NO_SLOWDOWN}x at every concurrency "
        "on both workloads.",
        "",
        "| configuration | repetitive, 1 stream | worst, repetitive | worst, open-ended | targets met |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for s in summary(rows, variants):
        lines.append(
            f"| {s['variant']} | {_fmt(s['repetitive_c1'], '.2f')}x | {_fmt(s['worst_repetitive'], '.2f')}x "
            f"| {_fmt(s['worst_open_ended'], '.2f')}x | {'yes' if s['meets_targets'] else 'no'} |"
        )
    shipped = next((r["schedule"] for r in rows if r["variant"] == "ngram-dynamic" and r["schedule"]), None)
    lines += [
        "",
        f"Schedule this run derives from the static ngram rows (per concurrency: the best repetitive "
        f"speed-up among token counts that keep both workloads >= {SCHEDULE_MARGIN}x; where none does, "
        f"the count, 0 included, whose worse workload is fastest): `{derived}`; measured as "
        f"ngram-dynamic: `{shipped}`. {NGRAM_PROFILE} ships it.",
    ]
    for workload in WORKLOADS:
        lines += [
            "",
            f"### {workload}",
            "",
            "| configuration | c | out tok/s | x plain | TPOT p50 ms | x plain | TPOT p99 ms | x plain "
            "| acceptance | mean accepted length | failures |",
            "| --- |" + " ---: |" * 10,
        ]
        for variant in variants:
            for concurrency in CONCURRENCY:
                r = find(rows, variant, workload, concurrency)
                if r is None:
                    continue
                lines.append(
                    f"| {variant} | {concurrency} | {_fmt(r['output_tokens_per_s'], '.0f')} | "
                    f"{_fmt(r['output_tokens_per_s_vs_plain'], '.2f')} | "
                    f"{_fmt(r['tpot_p50_s'] * 1000, '.1f')} | "
                    f"{_fmt(r['tpot_p50_s_vs_plain'], '.2f')} | {_fmt(r['tpot_p99_s'] * 1000, '.1f')} | "
                    f"{_fmt(r['tpot_p99_s_vs_plain'], '.2f')} | {_fmt(r['acceptance_rate'], '.2f')} | "
                    f"{_fmt(r['mean_accepted_length'], '.2f')} | {r['failures']} |"
                )
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], variants: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(13, 4.8), sharey=True)
    for axis, workload in zip(axes, WORKLOADS, strict=True):
        for variant in variants:
            points = [(c, find(rows, variant, workload, c)) for c in CONCURRENCY]
            xs = [c for c, r in points if r and r["output_tokens_per_s_vs_plain"] is not None]
            ys = [
                r["output_tokens_per_s_vs_plain"]
                for _, r in points
                if r and r["output_tokens_per_s_vs_plain"]
            ]
            axis.plot(xs, ys, marker="o", label=variant, linestyle="--" if variant == PLAIN else "-")
        axis.axhline(NO_SLOWDOWN, color="red", linewidth=0.8, linestyle=":", label=f"{NO_SLOWDOWN}x")
        axis.set_xscale("log", base=2)
        axis.set_xticks(CONCURRENCY, [str(c) for c in CONCURRENCY])
        axis.set_xlabel("concurrent streams")
        axis.set_title(f"{workload}: output tok/s / plain vLLM")
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("x plain vLLM")
    axes[1].legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__, REPO / "results" / "spec", VARIANTS)
    parser.add_argument("--no-publish", action="store_true", help="do not write docs/benchmarks")
    parser.add_argument("--set", action="append", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        measured = run_worker(args.worker, args.scale, args.seed, tuple(args.set))
        args.out.write_text(json.dumps(asyncio.run(measured)))
        return 0

    variants = [v for v in args.variants.split(",") if v]
    if variants[0] != PLAIN:
        variants.insert(0, PLAIN)
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    derived: list[list[int]] = []
    with tempfile.TemporaryDirectory(prefix="llmserve-spec-") as tmp:
        for variant in variants:
            extra: tuple[str, ...] = ()
            if variant == "ngram-dynamic":  # the schedule the static rows above justify
                add_ratios(rows)
                derived = derive_schedule(rows)
                extra = (f"engine.speculative.num_speculative_tokens_per_batch_size={json.dumps(derived)}",)
            rows += run_variant(variant, args.scale, args.seed, Path(tmp), extra)
    add_ratios(rows)
    derived = derived or derive_schedule(rows)
    report = markdown(rows, variants, derived, args.scale)
    print(report)
    args.out.mkdir(parents=True, exist_ok=True)
    command = " ".join(
        ["make bench-spec  # python -m loadtest.spec_bench", *(sys.argv[1:] if argv is None else argv)]
    )
    (args.out / "spec.json").write_text(json.dumps({
        "command": command, "machine": machine_description(), "elapsed_s": time.monotonic() - started,
        "derived_schedule": derived, "summary": summary(rows, variants), "rows": rows,
    }, indent=2))  # fmt: skip
    plot(rows, variants, args.out / "spec.png")
    if not args.no_publish:
        plot(rows, variants, benchmark_image("spec.png"))
        published = publish("spec", "Speculative decoding against plain vLLM", command, report,
                            images=(BENCHMARK_DOCS / "spec.png",))  # fmt: skip
        print(f"wrote {published}")
    print(f"wrote {args.out}/spec.json and spec.png ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
