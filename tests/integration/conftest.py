"""One real server process (real vLLM, real SmolLM2) for the whole test session.

It runs in the dtype `engine.dtype: auto` picks on this machine (bfloat16 where the CPU computes
it natively, float32 elsewhere), or in the one LLMSERVE_TEST_DTYPE names (`other`: the one auto
does not pick; `make test` runs the dtype-sensitive tests that way too). In bfloat16, vLLM's
greedy text can depend on the batch a request shares, so tests that assert two generations are
identical use `fp32_server`, where that holds (vLLM's batch-invariant mode needs CUDA and triton).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import openai
import pytest
from loadtest.server_process import ServerProcess, start_server

from llmserve.engine.dtype import resolve_dtype
from llmserve.engine_config import EngineConfig
from tests.integration.robustness import LEDGER

MODEL = "SmolLM2-135M-Instruct"
READY_TIMEOUT_S = 300
TEST_DTYPE_ENV = "LLMSERVE_TEST_DTYPE"
T = TypeVar("T")


def auto_dtype() -> str:
    """What `engine.dtype: auto` picks on this machine's CPU."""
    return resolve_dtype(EngineConfig())


def session_dtype() -> str:
    """The session server's dtype: auto's choice, the one LLMSERVE_TEST_DTYPE names, or `other`."""
    wanted = os.environ.get(TEST_DTYPE_ENV, "auto")
    if wanted == "other":
        return "float32" if auto_dtype() == "bfloat16" else "bfloat16"
    return auto_dtype() if wanted == "auto" else wanted


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


@contextmanager
def running_servers(
    tmp_path_factory: pytest.TempPathFactory,
    servers: Mapping[str, Sequence[str]],
    ended_by_tests: Collection[str] = (),
    env: Mapping[str, Mapping[str, str]] | None = None,
) -> Iterator[dict[str, ServerProcess]]:
    """Servers (name: command-line arguments) started side by side, all ready before the context
    begins, and stopped side by side when it ends. A start-up is mostly one process after another
    importing vLLM (the server, its engine core, its worker), one core at a time, so on two cores
    two servers started together are ready about as soon as one. Those not in `ended_by_tests`
    must end on SIGTERM with exit code 0, leave no process behind and log no traceback; tests end
    the others as they see fit. `env`: by name, variables a server has beside this process's."""
    started: dict[str, ServerProcess] = {}
    try:
        for name, args in servers.items():
            log = Path(tmp_path_factory.mktemp(name)) / "server.log"
            started[name] = start_server(log, *args, env=dict((env or {}).get(name, {})))
        for name, process in started.items():
            ready_after = process.wait_ready(READY_TIMEOUT_S)
            print(f"\nllmserve ({name}) ready after {ready_after:.1f} s (log: {process.log_path})")
        yield started
    finally:
        with ThreadPoolExecutor(max(1, len(started))) as pool:
            codes = dict(zip(started, pool.map(ServerProcess.stop, started.values()), strict=True))
        for name, process in started.items():
            if name in ended_by_tests:
                continue
            print(f"\nllmserve ({name}) exited with {codes[name]}")
            assert codes[name] == 0, f"a graceful SIGTERM must end in exit code 0:\n{process.log()[-3000:]}"
            assert process.left_behind == [], "every process the server started ends with it"
            assert process.log_problems() == [], "a clean stop logs no traceback"


def collected_users(request: pytest.FixtureRequest, fixture: str) -> list[pytest.Function]:
    """The tests collected in this session that use `fixture`."""
    items = request.session.items
    return [item for item in items if isinstance(item, pytest.Function) and fixture in item.fixturenames]


def users_in_module(request: pytest.FixtureRequest, fixture: str) -> int:
    """How many tests of the requesting module, collected in this session, use `fixture`."""
    return sum(item.module is request.module for item in collected_users(request, fixture))


@contextmanager
def running_server(
    tmp_path_factory: pytest.TempPathFactory, name: str, *args: str
) -> Iterator[ServerProcess]:
    """A server for as long as the context lasts; a graceful SIGTERM ends it with exit code 0."""
    with running_servers(tmp_path_factory, {name: args}) as servers:
        yield servers[name]


FP32_ARGS = ("--set", "engine.dtype=float32", "--set", "engine.kv_cache_memory_gib=0.5")


@pytest.fixture(scope="session")
def session_servers(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, ServerProcess]]:
    """The session's server, and beside it the float32 one when that is another and a test
    collected in this session uses it."""
    dtype = session_dtype()
    servers = {f"server-{dtype}": ("--config", "configs/cpu-smollm2.yaml", "--set", f"engine.dtype={dtype}")}
    if dtype != "float32" and collected_users(request, "fp32_server"):
        servers["server-float32"] = FP32_ARGS
    with running_servers(tmp_path_factory, servers) as started:
        yield started


@pytest.fixture(scope="session")
def server(session_servers: dict[str, ServerProcess]) -> ServerProcess:
    return session_servers[f"server-{session_dtype()}"]


@pytest.fixture(scope="session")
def fp32_server(session_servers: dict[str, ServerProcess]) -> ServerProcess:
    """A float32 server, for tests that assert two generations are identical."""
    return session_servers["server-float32"]


def openai_client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai_client(server)


@pytest.fixture(scope="session")
def fp32_client(fp32_server: ServerProcess) -> openai.OpenAI:
    return openai_client(fp32_server)


@pytest.fixture(scope="session")
def async_client(server: ServerProcess) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
