"""Drive a Workload through one sender (an engine in-process, or the HTTP API) and summarise it.

Every request is greedy with `ignore_eos`, so each engine generates exactly the same number of
tokens for the same request: throughput differences are the engines', not the outputs'.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass

import httpx
from tqdm import tqdm

from loadtest.workload import RequestShape, Workload

MODEL = "SmolLM2-135M-Instruct"


@dataclass(frozen=True)
class RequestResult:
    ok: bool
    ttft_s: float
    e2e_s: float
    output_tokens: int


Sender = Callable[[RequestShape], Awaitable[RequestResult]]


@dataclass(frozen=True)
class RunStats:
    workload: str
    requests: int
    failures: int
    duration_s: float
    requests_per_s: float
    output_tokens_per_s: float
    e2e_p50_s: float
    e2e_p99_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    tpot_p50_s: float  # time per output token after the first: (e2e - TTFT) / (tokens - 1)
    tpot_p99_s: float

    def as_dict(self) -> dict[str, float | int | str]:
        return asdict(self)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[rank]


def summarise(workload: str, results: list[RequestResult], duration_s: float) -> RunStats:
    done = [r for r in results if r.ok]
    tokens = sum(r.output_tokens for r in done)
    tpots = [(r.e2e_s - r.ttft_s) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
    return RunStats(
        workload=workload,
        requests=len(results),
        failures=len(results) - len(done),
        duration_s=duration_s,
        requests_per_s=len(done) / duration_s,
        output_tokens_per_s=tokens / duration_s,
        e2e_p50_s=percentile([r.e2e_s for r in done], 50),
        e2e_p99_s=percentile([r.e2e_s for r in done], 99),
        ttft_p50_s=percentile([r.ttft_s for r in done], 50),
        ttft_p99_s=percentile([r.ttft_s for r in done], 99),
        tpot_p50_s=percentile(tpots, 50),
        tpot_p99_s=percentile(tpots, 99),
    )


async def drive(workload: Workload, send: Sender, label: str = "") -> RunStats:
    """Open loop on arrival times, or `concurrency` clients back to back; a progress bar on stderr."""
    bar = tqdm(total=len(workload.requests), desc=f"{label} {workload.name}".strip(), unit="req", leave=False)
    results: list[RequestResult] = []
    started = time.perf_counter()

    async def one(shape: RequestShape) -> None:
        results.append(await send(shape))
        bar.update()

    if workload.concurrency is None:

        async def at_arrival(shape: RequestShape) -> None:
            await asyncio.sleep(max(0.0, started + shape.arrival_s - time.perf_counter()))
            await one(shape)

        await asyncio.gather(*(at_arrival(shape) for shape in workload.requests))
    else:
        pending = list(workload.requests)

        async def client() -> None:
            while pending:
                await one(pending.pop(0))

        await asyncio.gather(*(client() for _ in range(workload.concurrency)))
    bar.close()
    return summarise(workload.name, results, time.perf_counter() - started)


def engine_sender(engine: object) -> Sender:
    """Offline: straight into an EngineClient, no HTTP."""
    from llmserve.engine.base import EngineClient, SamplingSpec

    assert isinstance(engine, EngineClient)

    async def send(shape: RequestShape) -> RequestResult:
        sampling = SamplingSpec(max_tokens=shape.max_tokens, temperature=0.0, ignore_eos=True)
        start = time.perf_counter()
        first: float | None = None
        tokens = 0
        try:
            prompt = await engine.tokenize(shape.prompt)
            async for delta in engine.generate(prompt, sampling, uuid.uuid4().hex):
                if first is None and delta.token_ids:
                    first = time.perf_counter()
                tokens += len(delta.token_ids)
        except Exception:
            return RequestResult(False, 0.0, time.perf_counter() - start, 0)
        end = time.perf_counter()
        return RequestResult(True, (first or end) - start, end - start, tokens)

    return send


def http_sender(client: httpx.AsyncClient, base_url: str) -> Sender:
    """Online: a streaming /v1/completions call through the gateway; TTFT at the first token event."""

    async def send(shape: RequestShape) -> RequestResult:
        body = {
            "model": MODEL,
            "prompt": shape.prompt,
            "max_tokens": shape.max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        start = time.perf_counter()
        first: float | None = None
        tokens = 0
        try:
            async with client.stream("POST", f"{base_url}/v1/completions", json=body) as response:
                if response.status_code != 200:
                    await response.aread()
                    return RequestResult(False, 0.0, time.perf_counter() - start, 0)
                async for line in response.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[6:])
                    if first is None and event.get("choices") and event["choices"][0].get("text"):
                        first = time.perf_counter()
                    if event.get("usage"):
                        tokens = int(event["usage"]["completion_tokens"])
        except httpx.HTTPError:
            return RequestResult(False, 0.0, time.perf_counter() - start, 0)
        end = time.perf_counter()
        return RequestResult(True, (first or end) - start, end - start, tokens)

    return send
