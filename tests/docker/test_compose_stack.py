"""docker/compose.yaml with what can be had here (tests/docker/compose.local.yaml): the CPU server and
Prometheus from Debian's package. Prometheus finds llmserve up and sees the requests just sent."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
COMPOSE = ["docker-compose", "-p", "llmserve-test", "-f", str(REPO / "docker" / "compose.yaml"),
           "-f", str(REPO / "tests" / "docker" / "compose.local.yaml")]  # fmt: skip
PROMETHEUS = "http://127.0.0.1:9090"
LLMSERVE = "http://127.0.0.1:8000"


def compose(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    # Creating a container copies the whole 3 GB image with the vfs storage driver: more than
    # docker-compose's default 60 s API timeout.
    env = {**os.environ, "COMPOSE_HTTP_TIMEOUT": str(int(timeout))}
    result = subprocess.run([*COMPOSE, *args], capture_output=True, text=True, timeout=timeout, env=env)
    assert result.returncode == 0, f"docker-compose {' '.join(args)}:\n{result.stderr[-3000:]}"
    return result


def wait(condition, timeout_s: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if value := condition():
                return value
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise TimeoutError(what)


@pytest.fixture(scope="module")
def stack(image: str) -> Iterator[None]:
    compose("down", "--timeout", "10", timeout=120)  # whatever an interrupted run left
    try:
        compose("up", "-d", "--no-build", "llmserve", "prometheus")
        wait(lambda: httpx.get(f"{LLMSERVE}/ready", timeout=2).status_code == 200, 300, "llmserve ready")
        yield
    finally:
        print(compose("logs", "--no-color", "prometheus", timeout=60).stdout[-2000:])
        compose("down", "--timeout", "30", timeout=120)


def test_prometheus_scrapes_llmserve_and_sees_the_requests_sent(stack: None) -> None:
    def llmserve_target_up() -> bool:
        targets = httpx.get(f"{PROMETHEUS}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
        return any(t["labels"]["instance"] == "llmserve:8000" and t["health"] == "up" for t in targets)

    wait(llmserve_target_up, 120, "Prometheus marks llmserve:8000 up")
    body = {"model": "SmolLM2-135M-Instruct", "prompt": "Hello", "max_tokens": 2}
    for _ in range(3):
        assert httpx.post(f"{LLMSERVE}/v1/completions", json=body, timeout=60).status_code == 200

    def requests_seen() -> float:
        query = 'sum(llmserve_requests_total{route="/v1/completions",status="200"})'
        result = httpx.get(f"{PROMETHEUS}/api/v1/query", params={"query": query}, timeout=5).json()
        samples = result["data"]["result"]
        return float(samples[0]["value"][1]) if samples and float(samples[0]["value"][1]) >= 3 else 0.0

    seen = wait(requests_seen, 60, "Prometheus sees the 3 completions")
    print(f"\nPrometheus: llmserve:8000 up; llmserve_requests_total(/v1/completions, 200) = {seen:g}")
