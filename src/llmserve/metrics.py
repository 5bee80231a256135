"""Every gateway metric, defined once. vLLM's own `vllm:*` series are exposed beside them, not re-counted.

The gateway measures what vLLM cannot see: HTTP status, end-to-end latency as the client
experiences it, time to first token through the gateway, rejections and their reasons.
Queue wait inside the engine is vLLM's `vllm:request_queue_time_seconds`.

With one API process (the default) the series live in this process's registries. With several
(server.api_processes) every process writes its series to the group's Prometheus multiprocess
directory and any of them answers a scrape with the sum over all: counters and histograms add up,
the in-flight and waiting gauges are summed over the live processes, admission's predictions are
the most recent any process made; vLLM's own `vllm:*` series use the same mechanism (its engine
core sends scheduler stats to one front end only, so nothing is counted twice).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

from llmserve.errors import ServingError

if TYPE_CHECKING:
    from llmserve.engine.base import TokenTiming

# Bucket edges include 0.05, 0.1, 0.2 and 0.5 s so the 200 ms SLO line can be read off directly.
LATENCY_BUCKETS_S = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
    1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0,
)  # fmt: skip
TOKEN_LATENCY_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5,
)  # fmt: skip

# Refusals should take milliseconds: finer edges at the low end, and around the 10 ms a door
# refusal is held to at p99 (with edges at 5 and 10 ms only, a p99 between them was a straight-line
# guess across 5 ms, whatever the refusals' real times). A queued request refused after waiting
# waits seconds, up to its deadline: edges up to two minutes, or their p99 read as "5 s or more".
REFUSAL_BUCKETS_S = (
    0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0, 20.0, 30.0, 60.0, 120.0,
)  # fmt: skip

# Read in the kernel's ticks (1-4 ms): nothing finer than those, and up to the seconds a client waits
# before it gives up.
READ_DELAY_BUCKETS_S = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.5, 5.0)

# Actual over predicted: edges close around 1, where a few per cent decide a refusal at the SLO's edge.
PREDICTION_RATIO_BUCKETS = (
    0.25, 0.5, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0, 1.05, 1.1, 1.15, 1.2, 1.3, 1.5, 2.0, 4.0,
)  # fmt: skip
# A queued request's wait over its forecast: at light load the forecast ran 3-10x long (a wait of a
# step or two forecast at a second), so edges reach well below 1.
WAIT_FORECAST_RATIO_BUCKETS = (0.1, 0.25, 0.5, 0.7, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0)
ADMISSION_DECISIONS = ("run_at_once", "queued")
DEADLINE_OUTCOMES = ("met", "missed", "best_effort")

GENERATION_ROUTES = ("/v1/completions", "/v1/chat/completions")
KNOWN_ROUTES = (*GENERATION_ROUTES, "/v1/models", "/health", "/ready", "/metrics")
OTHER_ROUTE = "other"
AFTER_WAITING = "overloaded_after_waiting"
REJECTION_REASONS = (
    "rate_limited",
    "overloaded",
    AFTER_WAITING,
    "front_end_overloaded",
    "draining",
    "too_large",
    "timeout",
    "client_disconnected",
)
REFUSAL_TIMES = ("at_arrival", "after_waiting")


def route_label(path: str) -> str:
    """Paths outside the known routes share one label, so scanners cannot explode cardinality."""
    return path if path in KNOWN_ROUTES else OTHER_ROUTE


class GatewayMetrics:
    def __init__(
        self, model: str, registry: CollectorRegistry | None = None, multiprocess: bool = False
    ) -> None:
        self.model = model
        self.registry = registry or CollectorRegistry()
        self.multiprocess = multiprocess
        self._route_series: dict[str, RouteSeries] = {}
        # With several API processes a gauge cannot call back at scrape time (the scrape reads
        # every process's files): its value is set from these readers by `refresh()`.
        self._readers: list[tuple[Gauge, Callable[[], float]]] = []
        labels = ["model", "route"]
        self.requests = Counter(
            "llmserve_requests_total",
            "HTTP requests answered, by status code.",
            [*labels, "status"],
            registry=self.registry,
        )
        self.errors = Counter(
            "llmserve_request_errors_total",
            "Requests answered with an OpenAI error, by its code (also errors sent inside streams).",
            [*labels, "code"],
            registry=self.registry,
        )
        self.rejections = Counter(
            "llmserve_rejections_total",
            "Requests refused or cut short for load, policy or the client, by reason.",
            [*labels, "reason"],
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "llmserve_requests_in_flight",
            "Generation requests being served now (planning, queued, generating or streaming).",
            labels,
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.e2e_latency = Histogram(
            "llmserve_e2e_request_latency_seconds",
            "Arrival to last byte of successful generation requests, as the client sees them.",
            labels,
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.ttft = Histogram(
            "llmserve_time_to_first_token_seconds",
            "Arrival to the first generated token leaving the engine.",
            labels,
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.inter_token = Histogram(
            "llmserve_inter_token_latency_seconds",
            "Time between successive generated tokens of one choice.",
            labels,
            buckets=TOKEN_LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.time_per_output_token = Histogram(
            "llmserve_time_per_output_token_seconds",
            "(end-to-end - time to first token) / (generated tokens - 1), per request.",
            labels,
            buckets=TOKEN_LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.read_delay = Histogram(
            "llmserve_request_read_delay_seconds",
            "Time generation requests waited in the host's kernel (the accept queue, the socket's "
            "buffer) before the API process read them; the server's other clocks start after it.",
            labels,
            buckets=READ_DELAY_BUCKETS_S,
            registry=self.registry,
        )
        self.queue_wait = Histogram(
            "llmserve_queue_wait_seconds",
            "Time admitted requests waited in the gateway's admission queue.",
            labels,
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.rejection_latency = Histogram(
            "llmserve_rejection_latency_seconds",
            "Arrival to the answer of generation requests refused for load (429), measured in the "
            "server; when: at_arrival (before any wait) or after_waiting (queued, then refused).",
            [*labels, "when"],
            buckets=REFUSAL_BUCKETS_S,
            registry=self.registry,
        )
        self.prediction_ratio = Histogram(
            "llmserve_admission_e2e_prediction_ratio",
            "Completed requests' time from arrival until the engine finished them, over what "
            "admission predicted when it decided (its wait, if queued, and its service): below 1 "
            "admission is pessimistic (it refuses what it could serve in time), above 1 optimistic "
            "(answers come late). decision: run_at_once or queued.",
            ["model", "decision"],
            buckets=PREDICTION_RATIO_BUCKETS,
            registry=self.registry,
        )
        self.wait_forecast_ratio = Histogram(
            "llmserve_admission_queue_wait_prediction_ratio",
            "Completed queued requests' wait for admission over the wait admission forecast when it "
            "queued them: the part of the e2e prediction ratio that is the queue's own forecast.",
            ["model"],
            buckets=WAIT_FORECAST_RATIO_BUCKETS,
            registry=self.registry,
        )
        self.deadline_outcomes = Counter(
            "llmserve_admission_deadline_outcomes_total",
            "Completed requests admission decided on, by whether the engine finished them by their "
            "e2e deadline (outcome: met or missed; best_effort: admitted without one, as no e2e "
            "target is set or the request was predicted to miss it even alone) and how they were "
            "admitted (decision: run_at_once or queued): where the SLO's late answers come from.",
            ["model", "decision", "outcome"],
            registry=self.registry,
        )
        self.admitted_at_risk = Counter(
            "llmserve_admission_admitted_at_risk_total",
            "Completed queued requests admitted on the late-answer budget (time left for their "
            "median service, not for a slow one: refused after waiting otherwise), by whether the "
            "engine finished them by their e2e deadline (outcome: met or missed). Also counted in "
            "llmserve_admission_deadline_outcomes_total as queued.",
            ["model", "outcome"],
            registry=self.registry,
        )
        self.predicted_step = Gauge(
            "llmserve_admission_predicted_step_seconds",
            "Admission's prediction of one engine step (a token for every running sequence), by batch size.",
            ["model", "batch"],
            registry=self.registry,
            multiprocess_mode="livemostrecent",
        )
        self.predicted_prefill = Gauge(
            "llmserve_admission_predicted_prefill_seconds_per_1k_tokens",
            "Admission's prediction of the time to take 1000 prompt tokens in.",
            ["model"],
            registry=self.registry,
            multiprocess_mode="livemostrecent",
        )
        self.headroom = Gauge(
            "llmserve_admission_queue_headroom",
            "Share of its wait budget a request may be promised to be queued (steered by outcomes).",
            ["model"],
            registry=self.registry,
            multiprocess_mode="livemostrecent",
        )
        self.batch_limit = Gauge(
            "llmserve_admission_batch_limit",
            "Engine sequences admission runs at most now: the largest batch at which a typical request "
            "of the current traffic meets the SLO (admission.max_in_flight without one).",
            ["model"],
            registry=self.registry,
            multiprocess_mode="livemostrecent",
        )
        self.waiting = Gauge(
            "llmserve_requests_waiting",
            "Requests waiting in the gateway's admission queue now.",
            ["model"],
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        # One listening socket is shared by a group's API processes: each reads the same queue.
        self.accept_queue = Gauge(
            "llmserve_accept_queue_connections",
            "Connections the kernel has completed that no API process has accepted yet (Linux): "
            "requests waiting where admission cannot see them.",
            ["model"],
            registry=self.registry,
            multiprocess_mode="livemax",
        )
        self.accept_backlog = Gauge(
            "llmserve_accept_queue_limit",
            "The listen backlog: with this many connections queued the kernel drops new ones.",
            ["model"],
            registry=self.registry,
            multiprocess_mode="livemax",
        )
        self.prompt_tokens = Counter(
            "llmserve_prompt_tokens_total",
            "Prompt tokens of generation requests that reached the engine.",
            labels,
            registry=self.registry,
        )
        self.generation_tokens = Counter(
            "llmserve_generation_tokens_total",
            "Tokens generated for clients.",
            labels,
            registry=self.registry,
        )
        # Every generation-route series exists from the start, so dashboards read 0, not "no data".
        per_route = (
            self.e2e_latency,
            self.queue_wait,
            self.ttft,
            self.inter_token,
            self.time_per_output_token,
            self.prompt_tokens,
            self.generation_tokens,
        )
        for route in GENERATION_ROUTES:
            for metric in per_route:
                metric.labels(model, route)
            for reason in REJECTION_REASONS:
                self.rejections.labels(model, route, reason)
            for when in REFUSAL_TIMES:
                self.rejection_latency.labels(model, route, when)
        for decision in ADMISSION_DECISIONS:
            self.prediction_ratio.labels(model, decision)
            for outcome in DEADLINE_OUTCOMES:
                self.deadline_outcomes.labels(model, decision, outcome)
        for outcome in ("met", "missed"):  # an at-risk request always had a deadline
            self.admitted_at_risk.labels(model, outcome)

    def watch_service_model(
        self,
        step_s: Callable[[int], float],
        batches: tuple[int, ...],
        prefill_s: Callable[[int], float],
        headroom: Callable[[], float],
        batch_limit: Callable[[], int],
    ) -> None:
        """What admission predicts: the engine's step time at a few batch sizes, prefill cost; the
        share of a wait budget it promises, and the batch it fills the engine to."""
        for batch in batches:
            self._read(self.predicted_step.labels(self.model, str(batch)), partial(step_s, batch))
        self._read(self.predicted_prefill.labels(self.model), partial(prefill_s, 1000))
        self._read(self.headroom.labels(self.model), headroom)
        self._read(self.batch_limit.labels(self.model), batch_limit)

    def watch_queue(self, waiting: Callable[[], int], in_flight: Callable[[str], int]) -> None:
        """The gauges read the admission queue and the permits held (policy/): counted once, there."""
        self._read(self.waiting.labels(self.model), waiting)
        for route in GENERATION_ROUTES:
            self._read(self.in_flight.labels(self.model, route), partial(in_flight, route))

    def watch_accept_queue(self, read: Callable[[], tuple[int, int]]) -> None:
        """The kernel's accept queue in front of the API processes: (queued, backlog)."""
        self._read(self.accept_queue.labels(self.model), lambda: read()[0])
        self._read(self.accept_backlog.labels(self.model), lambda: read()[1])

    def _read(self, gauge: Gauge, reader: Callable[[], float]) -> None:
        if self.multiprocess:
            self._readers.append((gauge, reader))
        else:
            gauge.set_function(reader)

    def refresh(self) -> None:
        """Publish this process's gauge readings to the group (several API processes only)."""
        for gauge, reader in self._readers:
            gauge.set(reader())

    def exposition(self) -> bytes:
        """The scrape: the gateway's series and vLLM's (registered in the process-wide default
        registry), or with several API processes both summed over the whole group."""
        if not self.multiprocess:
            return generate_latest(self.registry) + generate_latest(REGISTRY)
        self.refresh()
        group = CollectorRegistry()
        multiprocess.MultiProcessCollector(group)  # type: ignore[no-untyped-call]
        return generate_latest(group)

    def observation(self, path: str) -> RequestObservation:
        return RequestObservation(self, route_label(path))

    def route_series(self, route: str) -> RouteSeries:
        """The series every request of a route touches, looked up once per route (a `labels()`
        call takes a lock and a dict lookup: too much for every token)."""
        series = self._route_series.get(route)
        if series is None:
            labels = (self.model, route)
            series = RouteSeries(
                ttft=self.ttft.labels(*labels),
                inter_token=self.inter_token.labels(*labels),
                generation_tokens=self.generation_tokens.labels(*labels),
                prompt_tokens=self.prompt_tokens.labels(*labels),
                queue_wait=self.queue_wait.labels(*labels),
                read_delay=self.read_delay.labels(*labels),
                e2e_latency=self.e2e_latency.labels(*labels),
                time_per_output_token=self.time_per_output_token.labels(*labels),
            )
            self._route_series[route] = series
        return series


@dataclass(frozen=True, slots=True)
class RouteSeries:
    ttft: Histogram
    inter_token: Histogram
    generation_tokens: Counter
    prompt_tokens: Counter
    queue_wait: Histogram
    read_delay: Histogram
    e2e_latency: Histogram
    time_per_output_token: Histogram


@dataclass
class RequestObservation:
    """One request's measurements, filled in as it passes through the layers."""

    metrics: GatewayMetrics
    route: str
    arrived_at: float = field(default_factory=time.perf_counter)  # when the server read it
    read_delay_s: float = 0.0  # how long it waited before that (api/read_delay.py)
    first_token_at: float | None = None
    generated_tokens: int = 0
    failed: bool = False
    refused_after_waiting: bool = False
    _last_token_at: dict[int, float] = field(default_factory=dict)
    series: RouteSeries = field(init=False)

    def __post_init__(self) -> None:
        self.series = self.metrics.route_series(self.route)

    @property
    def _labels(self) -> tuple[str, str]:
        return self.metrics.model, self.route

    def on_read(self, delay_s: float) -> None:
        """The request waited `delay_s` in the kernel before the server read it."""
        self.read_delay_s = delay_s
        if self.route in GENERATION_ROUTES:
            self.series.read_delay.observe(delay_s)

    def on_admitted(self, waited_s: float) -> None:
        self.series.queue_wait.observe(waited_s)

    def on_prompt(self, prompt_tokens: int) -> None:
        self.series.prompt_tokens.inc(prompt_tokens)

    def on_tokens(self, choice: int, count: int, timing: TokenTiming | None = None) -> None:
        if count <= 0:
            return
        now = time.perf_counter()
        first_at, last_at = (now, now) if timing is None else timing.placed(now)
        if self.first_token_at is None:
            self.first_token_at = first_at
            self.series.ttft.observe(first_at - self.arrived_at)
        previous = self._last_token_at.get(choice)
        if previous is not None:  # `count` tokens since the previous delta
            self._observe_gaps((last_at - previous) / count, count)
        elif timing is not None and count > 1:  # a choice delivered whole: count - 1 gaps
            self._observe_gaps((last_at - first_at) / (count - 1), count - 1)
        self._last_token_at[choice] = last_at
        self.generated_tokens += count
        self.series.generation_tokens.inc(count)

    def _observe_gaps(self, gap: float, count: int) -> None:
        for _ in range(count):
            self.series.inter_token.observe(gap)

    def on_error(self, error: ServingError) -> None:
        """The one place an error sent to the client (as JSON or inside a stream) is counted."""
        self.failed = True
        self.metrics.errors.labels(*self._labels, error.code or "unknown").inc()
        if error.rejection is not None:
            self.on_rejected(error.rejection)

    def on_admission_outcome(
        self,
        queued: bool,
        predicted_s: float,
        actual_s: float,
        met_deadline: bool | None,
        wait: tuple[float, float] | None = None,
        at_risk: bool = False,
    ) -> None:
        decision = "queued" if queued else "run_at_once"
        if predicted_s > 0:
            self.metrics.prediction_ratio.labels(self.metrics.model, decision).observe(actual_s / predicted_s)
        if wait is not None and wait[0] > 0:
            forecast_s, waited_s = wait
            self.metrics.wait_forecast_ratio.labels(self.metrics.model).observe(waited_s / forecast_s)
        outcome = "best_effort" if met_deadline is None else "met" if met_deadline else "missed"
        self.metrics.deadline_outcomes.labels(self.metrics.model, decision, outcome).inc()
        if at_risk and met_deadline is not None:
            self.metrics.admitted_at_risk.labels(self.metrics.model, outcome).inc()

    def on_rejected(self, reason: str) -> None:
        self.failed = True
        self.refused_after_waiting = self.refused_after_waiting or reason == AFTER_WAITING
        self.metrics.rejections.labels(*self._labels, reason).inc()

    def on_finished(self, status: int) -> None:
        """Called once, when the last byte of the response has gone (or the client has)."""
        self.metrics.requests.labels(*self._labels, str(status)).inc()
        if status == 429 and self.route in GENERATION_ROUTES:
            when = "after_waiting" if self.refused_after_waiting else "at_arrival"
            self.metrics.rejection_latency.labels(*self._labels, when).observe(
                time.perf_counter() - self.arrived_at
            )
        # A stream that failed or lost its client was sent as 200: it is still no success.
        if self.failed or not 200 <= status < 300 or self.route not in GENERATION_ROUTES:
            return
        e2e = time.perf_counter() - self.arrived_at
        self.series.e2e_latency.observe(e2e)
        if self.first_token_at is not None and self.generated_tokens > 1:
            decode_time = e2e - (self.first_token_at - self.arrived_at)
            per_token = decode_time / (self.generated_tokens - 1)
            self.series.time_per_output_token.observe(per_token)
