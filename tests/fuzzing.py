"""Schema fuzzing of a running server from its own /openapi.json, with schemathesis.

For every operation, hypothesis generates schema-valid (positive) and schema-violating (negative)
requests. Each response must: not be a 5xx; have a status the schema documents, the documented
content type and a body matching the documented schema; reject schema-violating data; and carry
an OpenAI error body when it is a 4xx. Schema-valid requests the server refuses on semantic
grounds (a prompt longer than the context, an unknown model name) are counted, not failed.

Generation is bounded so hundreds of cases fit in minutes on a CPU: every request gets at most
MAX_NEW_TOKENS new tokens (unless max_tokens is what violates the schema); schema-valid ones
also n <= 2 and a client `timeout` of at least 30 s (a deadline the client asks for is
answered with 504 by design). Abusive values of those fields
are covered by tests/integration/test_abuse_real_engine.py.

Generation is seeded: `make test` uses a fixed seed; `make fuzz` draws a new seed each run and
prints it, and LLMSERVE_FUZZ_SEED seeds a rerun. Small runs repeat exactly; longer ones need not
(two 100-case runs with one seed drew different mixes), so a seed narrows a rerun, not pins it.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, seed, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from llmserve.protocol.common import integral_float_as_int

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]
MAX_NEW_TOKENS = 4
MIN_CLIENT_TIMEOUT_S = 30.0
EXAMPLES_ENV = "LLMSERVE_FUZZ_EXAMPLES"
SEED_ENV = "LLMSERVE_FUZZ_SEED"
SLOWEST_KEPT = 5


@dataclass
class FuzzReport:
    seed: int
    cases: Counter[tuple[str, str]] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    schema_valid_refused: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    refusal_examples: dict[str, str] = field(default_factory=dict)
    schema_valid: Counter[str] = field(default_factory=Counter)
    schema_valid_served: Counter[str] = field(default_factory=Counter)
    seconds: dict[tuple[str, str], float] = field(default_factory=dict)
    slowest: list[tuple[float, str]] = field(default_factory=list)

    def timed(self, operation: str, mode: str, seconds: float, body: Any) -> None:
        """Where the run's time goes: per operation and mode, and its SLOWEST_KEPT slowest cases."""
        self.seconds[(operation, mode)] = self.seconds.get((operation, mode), 0.0) + seconds
        self.slowest.append((seconds, f"{operation} [{mode}] {_shape(body)}"))
        self.slowest.sort(reverse=True)
        del self.slowest[SLOWEST_KEPT:]

    def valid_rate(self, operation: str) -> float:
        """The share of schema-valid requests the server served: schemathesis warns that an
        operation "mostly rejected generated data" below 0.2 (its low_valid_rate threshold)."""
        total = self.schema_valid[operation]
        return self.schema_valid_served[operation] / total if total else 0.0

    @property
    def server_errors(self) -> int:
        return sum(count for status, count in self.statuses.items() if status >= 500)

    def summary(self) -> str:
        lines = [f"schema fuzzing (schemathesis, from /openapi.json, {SEED_ENV}={self.seed}):"]
        lines += [
            f"  {label} [{mode}]: {count} cases, {self.seconds.get((label, mode), 0.0):.1f} s in requests"
            for (label, mode), count in sorted(self.cases.items())
        ]
        lines.append("  slowest cases: " + "; ".join(f"{s:.2f} s {case}" for s, case in self.slowest))
        lines.append(
            "  responses by status: " + ", ".join(f"{s}: {n}" for s, n in sorted(self.statuses.items()))
        )
        lines.append(f"  5xx responses: {self.server_errors}")
        refused = ", ".join(f"{code}: {n}" for code, n in self.schema_valid_refused.most_common())
        lines.append(f"  schema-valid requests refused on semantic grounds: {refused or 'none'}")
        lines += [
            f"  {operation}: {self.valid_rate(operation):.0%} of schema-valid requests served"
            for operation in sorted(self.schema_valid)
        ]
        lines.append(f"  failed checks: {len(self.failures)}")
        lines += [f"    {failure}" for failure in self.failures[:20]]
        return "\n".join(lines)


def _shape(body: Any) -> str:
    """What makes a generation request costly, without the generated junk around it."""
    if not isinstance(body, dict):
        return type(body).__name__
    costly = ("n", "max_tokens", "max_completion_tokens", "logprobs", "echo", "top_logprobs")
    shape = {key: body[key] for key in costly if key in body}
    for key in ("prompt", "messages"):
        if isinstance(value := body.get(key), list | str):
            kind = f"list of {len(value)}" if isinstance(value, list) else "str"
            shape[key] = f"{kind}, {len(json.dumps(value, default=str))} chars"
    return json.dumps(shape, default=str)


def examples_per_operation(default: int) -> int:
    return int(os.environ.get(EXAMPLES_ENV, default))


def fuzz_seed(default: int) -> int:
    """The seed from the environment: a number, `random` for a fresh one, unset for `default`."""
    value = os.environ.get(SEED_ENV, "").strip()
    if value == "random":
        return random.SystemRandom().randrange(2**32)
    return int(value) if value else default


def openai_error_problem(response: Any) -> str | None:
    """None when a 4xx body is {"error": {"message": str, "type": str, ...}}."""
    try:
        body = json.loads(response.content or b"")
    except ValueError:
        return f"{response.status_code} body is not JSON: {response.content[:120]!r}"
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("message"), str) or not error.get("type"):
        return f"{response.status_code} body is not an OpenAI error: {str(body)[:160]}"
    return None


def _is_integral(value: Any) -> bool:
    """An integer as the server counts one: 410.0 is one too (schemathesis draws such values for
    integer fields; left uncapped, one case took 16 s), 1e20 is not and stays the violation."""
    value = integral_float_as_int(value)
    return isinstance(value, int) and not isinstance(value, bool)


def cap_new_tokens(body: Any) -> Any:
    """At most MAX_NEW_TOKENS, without touching a max_tokens value that is itself the violation."""
    if not isinstance(body, dict):
        return body
    capped = dict(body)
    for key in ("max_tokens", "max_completion_tokens"):
        if _is_integral(capped.get(key)) and capped[key] > MAX_NEW_TOKENS:
            capped[key] = MAX_NEW_TOKENS
    # null is schema-valid, so filling it in cannot hide a violation
    if capped.get("max_tokens") is None and capped.get("max_completion_tokens") is None:
        capped["max_tokens"] = MAX_NEW_TOKENS
    return capped


def bound_generation(body: Any) -> Any:
    """For schema-valid requests: capped tokens, n <= 2, and a client timeout of at least 30 s."""
    bounded = cap_new_tokens(body)
    if not isinstance(bounded, dict):
        return bounded
    if _is_integral(bounded.get("n")) and bounded["n"] > 2:
        bounded["n"] = 2
    timeout = bounded.get("timeout")
    if isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout < MIN_CLIENT_TIMEOUT_S:
        bounded["timeout"] = MIN_CLIENT_TIMEOUT_S
    return bounded


def fuzz(base_url: str, examples: int, fuzz_seed: int, request_timeout_s: float = 120) -> FuzzReport:
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    report = FuzzReport(seed=fuzz_seed)
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            _fuzz_operation(operation, mode, base_url, examples, request_timeout_s, report)
    return report


def _fuzz_operation(
    operation: Any, mode: GenerationMode, base_url: str, examples: int, timeout_s: float, report: FuzzReport
) -> None:
    @seed(report.seed)
    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    def run(case: Any) -> None:
        if case.body is not None:
            # A schema-violating request the server wrongly accepted must still finish quickly.
            bounded = bound_generation if mode is GenerationMode.POSITIVE else cap_new_tokens
            case.body = bounded(case.body)
        started = time.monotonic()
        response = case.call(base_url=base_url, timeout=timeout_s)
        report.timed(operation.label, mode.value, time.monotonic() - started, case.body)
        report.cases[(operation.label, mode.value)] += 1
        report.statuses[response.status_code] += 1
        if mode is GenerationMode.POSITIVE:
            report.schema_valid[operation.label] += 1
            report.schema_valid_served[operation.label] += 200 <= response.status_code < 300
        problems = []
        try:
            case.validate_response(response, checks=CHECKS)
        except Exception as exc:  # schemathesis raises a group of check failures
            problems.append(
                str(exc).strip().splitlines()[-1][:200] if str(exc).strip() else type(exc).__name__
            )
        if 400 <= response.status_code < 500:
            if (problem := openai_error_problem(response)) is not None:
                problems.append(problem)
            elif mode is GenerationMode.POSITIVE:
                error = json.loads(response.content)["error"]
                report.schema_valid_refused[f"{error.get('code')} ({error.get('param')})"] += 1
                report.refusal_examples.setdefault(
                    f"{error.get('code')} ({error.get('param')})", str(error.get("message"))[:160]
                )
        for problem in problems:
            report.failures.append(f"{operation.label} [{mode.value}] {response.status_code}: {problem}")

    try:
        run()
    except Unsatisfiable:  # nothing to violate: a GET without parameters has no negative cases
        report.cases[(operation.label, mode.value)] += 0
