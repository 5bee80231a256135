"""The CPU image, run as a user runs it: `make docker-test` builds it (scripts/docker-build.sh), then
these tests start containers of it on 127.0.0.1 and stop every one they start."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx
import pytest
from loadtest.server_process import free_port

IMAGE = os.environ.get("LLMSERVE_DOCKER_IMAGE", "llmserve:cpu")
READY_TIMEOUT_S = 300


def docker(*args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check, timeout=timeout)


@dataclass
class Container:
    name: str
    port: int
    started_at: float
    seen_while_loading: dict[str, set[int]]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def state(self) -> dict[str, object]:
        state: dict[str, object] = json.loads(
            docker("inspect", "--format", "{{json .State}}", self.name).stdout
        )
        return state

    def logs(self) -> str:
        result = docker("logs", self.name, check=False)
        return result.stdout + result.stderr

    def logged_at(self, text: str) -> float | None:
        """When (epoch seconds, by Docker's clock for the line) the container first logged `text`."""
        logs = docker("logs", "--timestamps", self.name, check=False)
        for line in (logs.stderr + logs.stdout).splitlines():
            stamp, _, message = line.partition(" ")
            if text in message:
                # RFC 3339 with up to nanoseconds and a Z; Python 3.11 parses microseconds.
                seconds, _, fraction = stamp.rstrip("Z").partition(".")
                return datetime.fromisoformat(seconds).replace(tzinfo=UTC).timestamp() + float(
                    f"0.{fraction or 0}"
                )
        return None

    def exec(self, *command: str) -> str:
        return docker("exec", self.name, *command).stdout

    def wait_ready(self) -> float:
        """Poll like a Kubernetes kubelet: /health (liveness) and /ready (readiness) until ready."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            for path in ("/health", "/ready"):
                try:
                    status = httpx.get(self.base_url + path, timeout=2).status_code
                except httpx.HTTPError:
                    continue
                self.seen_while_loading.setdefault(path, set()).add(status)
            if 200 in self.seen_while_loading.get("/ready", set()):
                return time.monotonic() - self.started_at
            assert self.state()["Running"], f"the container exited while starting:\n{self.logs()[-3000:]}"
            time.sleep(0.5)
        raise TimeoutError(f"not ready after {READY_TIMEOUT_S} s:\n{self.logs()[-3000:]}")


def run_container(*args: str) -> Container:
    name = f"llmserve-test-{uuid.uuid4().hex[:8]}"
    port = free_port()
    docker("run", "-d", "--name", name, "--shm-size=1g", "-p", f"127.0.0.1:{port}:8000", *args, IMAGE)
    return Container(name, port, time.monotonic(), {})


@pytest.fixture(scope="session")
def image() -> str:
    assert docker("image", "inspect", IMAGE, check=False).returncode == 0, (
        f"{IMAGE} is not built: run `make docker-test`"
    )
    return IMAGE


@pytest.fixture
def container_factory(image: str) -> Iterator[list[Container]]:
    """Containers a test starts; removed afterwards whatever happened."""
    started: list[Container] = []
    yield started
    for container in started:
        docker("rm", "-f", container.name, check=False)


@pytest.fixture(scope="module")
def serving(image: str) -> Iterator[Container]:
    """One container for the user-facing checks, ready."""
    container = run_container("-e", "LLMSERVE_SERVER__SHUTDOWN_TIMEOUT_S=10")
    try:
        ready_after = container.wait_ready()
        print(f"\ncontainer ready after {ready_after:.1f} s")
        yield container
    finally:
        docker("rm", "-f", container.name, check=False)
