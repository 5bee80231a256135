"""Locust users for llmserve: short completions, streaming completions and chat.

    locust -f loadtest/locustfile.py --host http://127.0.0.1:8000 --headless -u 50 -r 10 -t 60s

Choose the mix with --user-weights "completion=3,stream=1,chat=1"; prompt lengths with
--prompt-words "8,64" and output length with --max-tokens 16 (all seeded by --workload-seed).
Streaming users report, as their own rows, `TTFT` (time to first token) and `TPOT` (time per
output token after the first) next to the end-to-end `POST` rows. An API key, if the server
wants one, comes from $LLMSERVE_API_KEY.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import time
from typing import Any

from locust import FastHttpUser, between, events, task
from locust.env import Environment
from locust.stats import RequestStats, StatsEntry

from loadtest.locust_options import STREAM_HEADERS_NAME, USER_CLASS_NAMES, parse_weights
from loadtest.workload import seeded_prompt

MODEL = os.environ.get("LLMSERVE_MODEL", "SmolLM2-135M-Instruct")
STREAM_METRICS = ("TTFT", "TPOT")
STREAM_NAME = "/v1/completions stream"
_user_ids = itertools.count()


@events.init_command_line_parser.add_listener
def _add_arguments(parser: Any) -> None:
    parser.add_argument("--user-weights", default="completion=1,stream=1,chat=1", include_in_web_ui=True,
                        help="relative weights of the user classes, e.g. completion=3,chat=0")  # fmt: skip
    parser.add_argument("--prompt-words", default="8,64", help="min,max words per prompt")
    parser.add_argument("--max-tokens", type=int, default=16, help="max_tokens of every request")
    parser.add_argument("--workload-seed", type=int, default=0)
    parser.add_argument("--think-time", type=float, default=0.0, help="max seconds between a user's requests")
    parser.add_argument("--summary-json", default="", help="write the HTTP-only summary the SLO gate reads")


@events.init.add_listener
def _apply_weights(environment: Environment, **_: Any) -> None:
    options = environment.parsed_options
    if options is None:
        return
    weights = parse_weights(options.user_weights)
    for name, class_name in USER_CLASS_NAMES.items():
        globals()[class_name].weight = weights.get(name, 0)
    if environment.user_classes:
        environment.user_classes = [cls for cls in environment.user_classes if getattr(cls, "weight", 1) > 0]


class _LlmUser(FastHttpUser):
    abstract = True
    connection_timeout = 10.0
    network_timeout = 120.0

    def on_start(self) -> None:
        options = self.environment.parsed_options
        self.rng = random.Random(f"{getattr(options, 'workload_seed', 0)}-{next(_user_ids)}")
        words = str(getattr(options, "prompt_words", "8,64")).split(",")
        self.prompt_words = (int(words[0]), int(words[-1]))
        self.max_tokens = int(getattr(options, "max_tokens", 16))
        think = float(getattr(options, "think_time", 0.0))
        self.wait_time = between(0, think) if think > 0 else (lambda: 0)  # type: ignore[method-assign]
        key = os.environ.get("LLMSERVE_API_KEY")
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}

    def prompt(self) -> str:
        return seeded_prompt(self.rng, *self.prompt_words)


class CompletionUser(_LlmUser):
    @task
    def completion(self) -> None:
        body = {"model": MODEL, "prompt": self.prompt(), "max_tokens": self.max_tokens, "temperature": 0.7}
        with self.client.post("/v1/completions", json=body, headers=self.headers,
                              name="/v1/completions", catch_response=True) as response:  # fmt: skip
            if response.status_code != 200:
                response.failure(f"{response.status_code}: {response.text[:200] if response.text else ''}")


class ChatUser(_LlmUser):
    @task
    def chat(self) -> None:
        messages = [{"role": "user", "content": self.prompt()}]
        body = {"model": MODEL, "messages": messages, "max_tokens": self.max_tokens, "temperature": 0.7}
        with self.client.post("/v1/chat/completions", json=body, headers=self.headers,
                              name="/v1/chat/completions", catch_response=True) as response:  # fmt: skip
            if response.status_code != 200:
                response.failure(f"{response.status_code}: {response.text[:200] if response.text else ''}")


class StreamFailedError(Exception):
    pass


class StreamingCompletionUser(_LlmUser):
    """Locust times a streamed response to its headers; this user also reports the whole stream
    (`POST /v1/completions stream`), its TTFT and its TPOT. The headers-only row is left out of
    the SLO summary."""

    @task
    def stream(self) -> None:
        body = {"model": MODEL, "prompt": self.prompt(), "max_tokens": self.max_tokens, "temperature": 0.7,
                "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
        started = time.perf_counter()
        first_token_at: float | None = None
        tokens = 0
        error: str | None = None
        with self.client.post("/v1/completions", json=body, headers=self.headers, stream=True,
                              name=STREAM_HEADERS_NAME, catch_response=True) as response:  # fmt: skip
            if response.status_code != 200:
                error = f"HTTP {response.status_code}"
            else:
                for line in _sse_lines(response):
                    if line == "[DONE]":
                        break
                    event = json.loads(line)
                    if "error" in event:
                        error = f"stream error {event['error'].get('code')}"
                        break
                    if first_token_at is None and event.get("choices") and event["choices"][0].get("text"):
                        first_token_at = time.perf_counter()
                    if event.get("usage"):
                        tokens = int(event["usage"]["completion_tokens"])
            if error is not None:
                response.failure(error)
        finished = time.perf_counter()
        self._report("POST", (finished - started) * 1000, StreamFailedError(error) if error else None)
        if error is None and first_token_at is not None:
            self._report("TTFT", (first_token_at - started) * 1000)
            if tokens > 1:
                self._report("TPOT", (finished - first_token_at) * 1000 / (tokens - 1))

    def _report(self, kind: str, milliseconds: float, exception: Exception | None = None) -> None:
        self.environment.events.request.fire(
            request_type=kind, name=STREAM_NAME, response_time=milliseconds,
            response_length=0, exception=exception, context={},
        )  # fmt: skip


def summarise(stats: RequestStats) -> dict[str, Any]:
    """Whole HTTP requests only: Locust's "Aggregated" row would mix in TTFT/TPOT and headers-only rows."""
    http = StatsEntry(stats, "HTTP", "HTTP")
    rows: dict[str, dict[str, float]] = {}
    for entry in stats.entries.values():
        if entry.name == STREAM_HEADERS_NAME:
            continue
        if entry.method in STREAM_METRICS:
            rows[entry.method] = {
                "count": entry.num_requests,
                "p50_ms": entry.get_response_time_percentile(0.5),
                "p99_ms": entry.get_response_time_percentile(0.99),
            }
        else:
            http.extend(entry)
    duration_s = max(1e-9, (http.last_request_timestamp or 0) - http.start_time)
    return {
        "requests": http.num_requests,
        "failures": http.num_failures,
        "duration_s": duration_s,
        "requests_per_s": (http.num_requests - http.num_failures) / duration_s,
        "p50_ms": http.get_response_time_percentile(0.5) if http.num_requests else None,
        "p99_ms": http.get_response_time_percentile(0.99) if http.num_requests else None,
        "failure_ratio": http.num_failures / http.num_requests if http.num_requests else 1.0,
        "stream_metrics": rows,
        "errors": [f"{e.method} {e.name}: {e.error} x{e.occurrences}" for e in stats.errors.values()][:10],
    }


@events.quitting.add_listener
def _write_summary(environment: Environment, **_: Any) -> None:
    path = getattr(environment.parsed_options, "summary_json", "")
    if path:
        with open(path, "w", encoding="utf-8") as out:
            json.dump(summarise(environment.stats), out, indent=2)


def _sse_lines(response: Any) -> Any:
    """SSE `data:` payloads as they arrive. geventhttpclient's read(n) waits for n bytes, which
    would deliver a short stream in one piece at its end; readline returns each line at once."""
    raw = response._response
    while line := raw.readline(b"\n"):
        text = line.decode("utf-8", errors="replace").strip()
        if text.startswith("data: "):
            yield text[6:]
