"""The front end at GPU rates: llmserve and `vllm serve` side by side in one run.

    python -m loadtest.frontend_bench            (what `make bench-frontend` runs)

1. The real CPU engine (configs/cpu-smollm2.yaml): 16 connections of 16-token completions, back to
   back, with wrk (compiled) for --duration s: req/s, p50/p99, and CPU milliseconds per request of
   every process (API server(s), vLLM's engine core, the load generator).
2. A SIMULATED H200 (configs/sim-h200-smollm2.yaml; the same simulated executor under both
   servers, docs/simulated-gpu.md): the offered rate stepped up (--rates) with hey (compiled;
   rate-limited workers, one connection each, enough of them that each waits longer than the SLO
   between its requests), --step-duration s per rate, until p99 misses 200 ms, a request fails
   or the rate offered falls short; the highest rate that held is each server's.

Servers: llmserve with one and with two API processes (server.api_processes), `vllm serve`, and
`vllm serve --api-server-count 2`. On a
2-core machine the load generator, the API process(es) and the engine core share two cores: the
CPU per process is what says what a 16-core GPU node would need. Writes
results/frontend/frontend.json and docs/benchmarks/frontend.md. Loopback only, bounded in time.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import psutil

from llmserve.server_group import API_PROCESS_PREFIX
from loadtest.bench_driver import percentile
from loadtest.report import publish
from loadtest.server_process import REPO, ServerProcess, start_server, start_vllm_serve

CPU_PROFILE = REPO / "configs" / "cpu-smollm2.yaml"
SIM_PROFILE = REPO / "configs" / "sim-h200-smollm2.yaml"
SLO_P99_S = 0.200
PROMPT = "The capital of France is"
SERVERS = ("llmserve", "llmserve x2", "vllm serve", "vllm serve x2")


@dataclass
class Measurement:
    engine: str  # "CPU" or "simulated H200"
    server: str
    offered_rps: float | None  # None: back to back (fixed concurrency)
    requests: int
    errors: int
    rps: float
    p50_ms: float
    p99_ms: float
    cpu_ms_per_request: dict[str, float]  # process role -> CPU ms per answered request

    @property
    def holds_slo(self) -> bool:
        offered_enough = self.offered_rps is None or self.rps >= 0.95 * self.offered_rps
        return self.errors == 0 and self.p99_ms < SLO_P99_S * 1000 and offered_enough


def body(model: str) -> str:
    return json.dumps({"model": model, "prompt": PROMPT, "max_tokens": 16, "ignore_eos": True})


def role(process: psutil.Process, root_pid: int, group: bool) -> str:
    """What a process of a server's tree is: API process, vLLM's engine core, its model worker, or
    (with several API processes) the supervisor that started them."""
    try:
        title = f"{process.name()} {' '.join(process.cmdline())}"
    except psutil.Error:
        return "gone"
    if "EngineCore" in title:
        return "engine core"
    if "Worker" in title:
        return "model worker"  # vLLM's CPU executor runs the forward pass in a worker process
    if "APIServer" in title or process.name().startswith(API_PROCESS_PREFIX):
        return "API"
    if process.pid == root_pid:
        return "supervisor" if group else "API"
    return "other"


class CpuMeter:
    """CPU seconds each process of a server's tree (and the load generator) spent in a window."""

    def __init__(self, server: ServerProcess, group: bool) -> None:
        self.server = server
        self.group = group
        self.start = self._sample()

    def _sample(self) -> dict[int, tuple[str, float]]:
        samples: dict[int, tuple[str, float]] = {}
        for process in self.server.processes():
            try:
                times = process.cpu_times()
                samples[process.pid] = (
                    role(process, self.server.process.pid, self.group),
                    times.user + times.system,
                )
            except psutil.Error:
                continue
        return samples

    def per_request(self, requests: int, generator_s: float) -> dict[str, float]:
        end = self._sample()
        spent: dict[str, float] = {}
        for pid, (name, seconds) in end.items():
            spent[name] = spent.get(name, 0.0) + seconds - self.start.get(pid, (name, 0.0))[1]
        spent["load generator"] = generator_s
        return {name: 1000 * seconds / max(1, requests) for name, seconds in sorted(spent.items())}


def child_cpu_s() -> float:
    """CPU seconds of this process's finished children: the load generator runs."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return float(usage.ru_utime + usage.ru_stime)


def wrk(url: str, model: str, seconds: float, connections: int = 16) -> tuple[int, int, float, float, float]:
    """wrk back to back: (requests, non-2xx, req/s, p50 ms, p99 ms)."""
    script = Path(tempfile.mkstemp(suffix=".lua")[1])
    script.write_text(
        f"wrk.method = \"POST\"\nwrk.body = '{body(model)}'\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
    )
    output = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds:.0f}s", "--latency", "-s", str(script), url],
        capture_output=True, text=True, check=True, timeout=seconds + 60,
    ).stdout  # fmt: skip
    script.unlink()

    def latency_ms(q: int) -> float:
        match = re.search(rf"\s{q}%\s+([\d.]+)(us|ms|s)\b", output)
        assert match, output
        value, unit = float(match.group(1)), match.group(2)
        return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value

    requests = int(re.search(r"(\d+) requests in", output).group(1))  # type: ignore[union-attr]
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    errors = int(non_2xx.group(1)) if non_2xx else 0
    errors += sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", output))
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1))  # type: ignore[union-attr]
    return requests, errors, rps, latency_ms(50), latency_ms(99)


def hey(url: str, model: str, rate: float, seconds: float) -> tuple[int, int, float, float, float]:
    """hey at an offered rate: workers rate-limited to 4 req/s each (250 ms apart, longer than the
    SLO), so until latency passes the SLO every request leaves on schedule. Returns (requests,
    errors, answered per second, p50 ms, p99 ms) from hey's per-request CSV."""
    workers = max(4, math.ceil(rate / 4))
    result = subprocess.run(
        ["hey", "-z", f"{seconds:.0f}s", "-c", str(workers), "-q", f"{rate / workers:.4f}", "-t", "10",
         "-m", "POST", "-T", "application/json", "-d", body(model), "-o", "csv", url],
        capture_output=True, text=True, timeout=seconds + 60,
    )  # fmt: skip
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    latencies = [float(row["response-time"]) * 1000 for row in rows if row.get("status-code") == "200"]
    errors = len(rows) - len(latencies) + len(re.findall(r"\bError\b|\berror\b", result.stderr))
    return len(rows), errors, len(latencies) / seconds, percentile(latencies, 50), percentile(latencies, 99)


@contextmanager
def serving(name: str, profile: Path, tmp: Path) -> Iterator[ServerProcess]:
    log = tmp / f"{name.replace(' ', '-')}-{profile.stem}.log"
    if name == "llmserve":
        server = start_server(log, "--config", str(profile))
    elif name == "llmserve x2":
        server = start_server(log, "--config", str(profile), "--set", "server.api_processes=2")
    elif name == "vllm serve":
        server = start_vllm_serve(log, profile)
    else:
        server = start_vllm_serve(log, profile, "--api-server-count", "2")
    try:
        ready = server.wait_ready(600)
        print(f"{name} ({profile.name}) ready after {ready:.0f} s", flush=True)
        yield server
    finally:
        server.stop()


def model_name(profile: Path) -> str:
    from llmserve.config import load_config

    return load_config(profile).server.served_model_name


def measure(
    server: ServerProcess, engine: str, name: str, offered: float | None, run: Callable[[], tuple[int, ...]]
) -> Measurement:
    meter = CpuMeter(server, group=name.endswith(" x2"))
    generator_before = child_cpu_s()
    requests, errors, rps, p50, p99 = run()
    cpu = meter.per_request(requests - errors, child_cpu_s() - generator_before)
    row = Measurement(
        engine, name, offered, int(requests), int(errors), float(rps), float(p50), float(p99), cpu
    )
    print(json.dumps(asdict(row)), flush=True)
    return row


def run_cpu_engine(names: list[str], seconds: float, tmp: Path) -> list[Measurement]:
    rows = []
    model = model_name(CPU_PROFILE)
    for name in names:
        with serving(name, CPU_PROFILE, tmp) as server:
            url = f"{server.base_url}/v1/completions"
            wrk(url, model, 5)  # warm-up
            rows.append(measure(server, "CPU", name, None, partial(wrk, url, model, seconds)))
    return rows


def run_simulated(names: list[str], rates: list[float], seconds: float, tmp: Path) -> list[Measurement]:
    rows = []
    model = model_name(SIM_PROFILE)
    for name in names:
        with serving(name, SIM_PROFILE, tmp) as server:
            url = f"{server.base_url}/v1/completions"
            hey(url, model, rates[0], 5)  # warm-up
            for rate in rates:
                row = measure(server, "simulated H200", name, rate, partial(hey, url, model, rate, seconds))
                rows.append(row)
                if not row.holds_slo:
                    break
                server.wait_engine_idle(30)
    return rows


def highest_passing(rows: list[Measurement], name: str) -> float | None:
    rates = [row.offered_rps for row in rows if row.server == name and row.holds_slo and row.offered_rps]
    return max(rates) if rates else None


def cpu_text(cpu: dict[str, float]) -> str:
    return ", ".join(f"{role} {ms:.2f}" for role, ms in cpu.items() if ms > 0.005)


def markdown(cpu_rows: list[Measurement], sim_rows: list[Measurement], names: list[str], args: Any) -> str:
    lines = [
        "## 1. Real CPU engine: 16 connections, 16-token completions back to back "
        f"(wrk, {args.duration:.0f} s)",
        "",
        "| server | req/s | p50 ms | p99 ms | errors | CPU ms per request, by process |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    lines += [
        f"| {r.server} | {r.rps:.1f} | {r.p50_ms:.1f} | {r.p99_ms:.1f} | {r.errors} | "
        f"{cpu_text(r.cpu_ms_per_request)} |"
        for r in cpu_rows
    ]
    base = next((r for r in cpu_rows if r.server == "vllm serve"), None)
    ours = next((r for r in cpu_rows if r.server == "llmserve"), None)
    if base and ours:
        api = ours.cpu_ms_per_request.get("API", 0) / max(1e-9, base.cpu_ms_per_request.get("API", 0))
        lines += [
            "",
            f"llmserve / vllm serve: req/s {ours.rps / base.rps:.2f}x, p99 {ours.p99_ms / base.p99_ms:.2f}x, "
            f"API-process CPU per request {api:.2f}x.",
        ]
    lines += [
        "",
        f"## 2. Simulated H200 (configs/sim-h200-smollm2.yaml): offered rate stepped up (hey, "
        f"{args.step_duration:.0f} s per rate), SLO p99 < {SLO_P99_S * 1000:.0f} ms",
        "",
        "A SIMULATION: vLLM's scheduler, KV cache, engine core and detokenizer run for real; the "
        "forward pass is a roofline model of an H200 (docs/simulated-gpu.md).",
        "",
        "| server | offered req/s | answered req/s | p50 ms | p99 ms | errors | holds | CPU ms per request |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    lines += [
        f"| {r.server} | {r.offered_rps:.0f} | {r.rps:.1f} | {r.p50_ms:.1f} | {r.p99_ms:.1f} | {r.errors} | "
        f"{'yes' if r.holds_slo else '**no**'} | {cpu_text(r.cpu_ms_per_request)} |"
        for r in sim_rows
    ]
    lines += ["", "Highest rate held at p99 < 200 ms:", ""]
    for name in names:
        rate = highest_passing(sim_rows, name)
        lines.append(f"- {name}: {f'{rate:.0f} req/s' if rate else 'none of the rates tried'}")
    lines += ["", "## A 16-core GPU node, by the CPU each process spent per request here", ""]
    for name in names:
        held = [r for r in sim_rows if r.server == name and r.holds_slo]
        if not held:
            continue
        top = held[-1]
        need = {
            role: ms for role, ms in top.cpu_ms_per_request.items() if role != "load generator" and ms > 0.005
        }
        # X ms of CPU per request at 1000 requests per second is X seconds per second: X cores.
        per_role = ", ".join(
            f"{role} {ms:.2f} ms/request = {ms:.2f} cores at 1000 req/s" for role, ms in need.items()
        )
        processes = 2 if name.endswith("x2") else 1
        ceiling = 1000 * processes / need["API"] if need.get("API") else float("nan")
        lines.append(
            f"- {name} at {top.offered_rps:.0f} req/s: {per_role}; its {processes} API process(es) "
            f"saturate at ~{ceiling:.0f} req/s (a core each)"
        )
    lines += [
        "",
        "`llmserve x2` is `server.api_processes: 2` (two API processes over one engine core, "
        "docs/operations.md); `vllm serve x2` is vLLM's own `--api-server-count 2` on the same engine.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=REPO / "results" / "frontend")
    parser.add_argument("--duration", type=float, default=30, help="seconds of the CPU-engine run")
    parser.add_argument("--step-duration", type=float, default=15, help="seconds per offered rate")
    parser.add_argument("--rates", default="100,200,300,400,600,800,1000,1200")
    parser.add_argument("--servers", default=",".join(SERVERS))
    parser.add_argument("--skip-cpu", action="store_true", help="only the simulated engine")
    parser.add_argument("--no-publish", action="store_true", help="do not write docs/benchmarks")
    args = parser.parse_args(argv)
    for tool in ("wrk", "hey"):
        if shutil.which(tool) is None:
            print(f"frontend_bench: needs {tool} (Debian: apt-get install {tool})", file=sys.stderr)
            return 2
    names = [name for name in args.servers.split(",") if name]
    rates = [float(rate) for rate in args.rates.split(",")]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="llmserve-frontend-") as tmp:
        cpu_rows = [] if args.skip_cpu else run_cpu_engine(names, args.duration, Path(tmp))
        sim_rows = run_simulated(names, rates, args.step_duration, Path(tmp))
    report = markdown(cpu_rows, sim_rows, names, args)
    print(report)
    command = " ".join(
        [
            "make bench-frontend  # python -m loadtest.frontend_bench",
            *(sys.argv[1:] if argv is None else argv),
        ]
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "frontend.json").write_text(json.dumps({
        "command": command, "elapsed_s": time.monotonic() - started,
        "rows": [asdict(row) | {"holds_slo": row.holds_slo} for row in cpu_rows + sim_rows],
    }, indent=2))  # fmt: skip
    if not args.no_publish:
        print(f"wrote {publish('frontend', 'The front end at GPU rates', command, report)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
