"""The limits hold across a group of API processes: the engine load and a key's rate-limit buckets
live in shared memory, and a take that would break a limit fails in whichever process it runs.

Real spawned processes race for the same room; none of them gives anything back, so the number
of successful takes is exactly the limit, however the races fall."""

from __future__ import annotations

import multiprocessing
import time

import pytest

from llmserve.config import AuthConfig
from llmserve.policy.rate_limits import RateLimiter
from llmserve.policy.shared_state import EngineLoad, SharedState

PROCESSES = 3
ATTEMPTS = 40


def take_engine_room(shared: SharedState, start: float, results: multiprocessing.Queue[int]) -> None:
    while time.monotonic() < start:
        pass
    load = shared.engine_load()
    results.put(sum(load.try_take(1, 10, 5, None) for _ in range(ATTEMPTS)))


def take_key_requests(shared: SharedState, start: float, results: multiprocessing.Queue[int]) -> None:
    limiter = RateLimiter(AuthConfig(requests_per_minute=7), shared=shared)
    while time.monotonic() < start:
        pass
    taken = 0
    for _ in range(ATTEMPTS):
        bucket = limiter.limits_of("key-a")
        assert bucket is not None
        assert bucket.requests is not None
        taken += bucket.requests.try_take(1)
    results.put(taken)


def race(target: object, shared: SharedState) -> list[int]:
    context = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue[int] = context.Queue()
    start = time.monotonic() + 2.0  # all spawned and spinning before the first take
    processes = [context.Process(target=target, args=(shared, start, results)) for _ in range(PROCESSES)]
    for process in processes:
        process.start()
    counts = [results.get(timeout=60) for _ in processes]
    for process in processes:
        process.join(timeout=30)
        assert process.exitcode == 0
    return counts


def test_the_engine_load_limit_holds_across_processes() -> None:
    shared = SharedState.create([])
    counts = race(take_engine_room, shared)
    assert sum(counts) == 5
    assert shared.engine_load().sequences == 5
    assert shared.engine_load().kv_tokens == 50


def test_a_keys_request_bucket_is_one_bucket_across_processes() -> None:
    shared = SharedState.create(["key-a", "key-b"])
    counts = race(take_key_requests, shared)
    assert sum(counts) == 7
    # The other key's bucket is its own, untouched.
    other = RateLimiter(AuthConfig(requests_per_minute=7), shared=shared).limits_of("key-b")
    assert other is not None
    assert other.requests is not None
    assert other.requests.level == pytest.approx(7, abs=0.01)


def test_alone_a_request_always_fits_and_room_comes_back() -> None:
    load = EngineLoad()
    assert load.try_take(8, 100, limit=4, kv_capacity=10)  # larger than every limit, but alone
    assert not load.try_take(1, 1, limit=4, kv_capacity=None)
    load.give_back(8, 100)
    assert load.try_take(4, 10, limit=4, kv_capacity=10)
    assert not load.try_take(1, 0, limit=4, kv_capacity=10)


def test_the_shared_state_travels_to_spawned_processes_without_its_cache() -> None:
    shared = SharedState.create(["k"])
    shared.engine_load()
    state = shared.__getstate__()
    assert state["_load"] is None
