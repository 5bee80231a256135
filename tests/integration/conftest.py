"""One real server process (real vLLM, real SmolLM2) for the whole test session."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import openai
import pytest
from loadtest.server_process import ServerProcess, start_server

from tests.integration.robustness import LEDGER

MODEL = "SmolLM2-135M-Instruct"
READY_TIMEOUT_S = 300
T = TypeVar("T")


def eventually(condition: Callable[[], T], timeout_s: float, interval_s: float = 0.1) -> T:
    """Poll until `condition()` is truthy or the timeout passes; return its last value.

    For what the server does asynchronously: vLLM's gauges follow its steps, and a signal or a
    disconnect is handled on the server's own event loop."""
    deadline = time.monotonic() + timeout_s
    while not (value := condition()) and time.monotonic() < deadline:
        time.sleep(interval_s)
    return value


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if summary := LEDGER.summary():
        terminalreporter.write_sep("-", "robustness")
        terminalreporter.write_line(summary)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration" in str(item.path):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log_path = Path(tmp_path_factory.mktemp("server")) / "server.log"
    process = start_server(log_path, "--config", "configs/cpu-smollm2.yaml")
    try:
        ready_after = process.wait_ready(READY_TIMEOUT_S)
        print(f"\nllmserve ready after {ready_after:.1f} s (log: {log_path})")
        yield process
    finally:
        code = process.stop()
        print(f"\nllmserve exited with {code}")
        assert code == 0, f"a graceful SIGTERM must end in exit code 0:\n{process.log()[-3000:]}"


@pytest.fixture(scope="session")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def async_client(server: ServerProcess) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
