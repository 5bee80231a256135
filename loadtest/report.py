"""Where benchmark tables go: `docs/benchmarks/<name>.md`, written by the command that measured them,
headed by the machine, its CPU and the dtype `auto` picks there, the date and the commit."""

from __future__ import annotations

import argparse
import datetime
import platform
import subprocess
from collections.abc import Iterable
from pathlib import Path

import psutil

from llmserve.engine.dtype import cpu_has_native_bf16

REPO = Path(__file__).resolve().parents[1]
BENCHMARK_DOCS = REPO / "docs" / "benchmarks"


def benchmark_parser(doc: str | None, default_out: Path, variants: Iterable[str]) -> argparse.ArgumentParser:
    """The flags every benchmark command shares (`--worker` is how it runs one engine per process)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=default_out)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every request count")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variants", default=",".join(variants), help="comma-separated subset")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    return parser


def benchmark_image(name: str) -> Path:
    """Where a benchmark's chart goes beside its table (the directory made if needed)."""
    BENCHMARK_DOCS.mkdir(parents=True, exist_ok=True)
    return BENCHMARK_DOCS / name


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_description() -> str:
    bf16 = (
        "native bf16 (AVX512-BF16/AMX): dtype auto = bfloat16"
        if cpu_has_native_bf16()
        else ("no native bf16: dtype auto = float32")
    )
    return (
        f"{cpu_model()}, {psutil.cpu_count()} logical CPUs, "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB, no GPU; {bf16}"
    )


def commit() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            # The tables and images benchmarks write themselves are no change to the code measured.
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs/benchmarks"],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        return head + (" (with uncommitted changes)" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def publish(name: str, title: str, command: str, body: str, images: tuple[Path, ...] = ()) -> Path:
    """Write `docs/benchmarks/<name>.md` (images beside it); return its path."""
    BENCHMARK_DOCS.mkdir(parents=True, exist_ok=True)
    links = "".join(f"\n![{image.stem}]({image.name})\n" for image in images)
    today = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    text = (
        f"# {title}\n\n"
        f"Written by `{command}`; do not edit by hand, run it again.\n\n"
        f"- machine: {machine_description()}\n- date: {today}\n- commit: {commit()}\n\n"
        f"{body.strip()}\n{links}"
    )
    path = BENCHMARK_DOCS / f"{name}.md"
    path.write_text(text)
    return path
