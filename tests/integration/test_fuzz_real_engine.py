"""Schema fuzzing of the real server from its own /openapi.json (schemathesis; see tests/fuzzing.py).

`make test` tries FUZZ_EXAMPLES cases per operation and mode (a few hundred in all); `make fuzz`
sets LLMSERVE_FUZZ_EXAMPLES for thousands, and a fresh LLMSERVE_FUZZ_SEED (printed) each run.
"""

from __future__ import annotations

import time

import httpx
from loadtest.server_process import ServerProcess

from tests.fuzzing import examples_per_operation, fuzz, fuzz_seed
from tests.integration.robustness import LEDGER

FUZZ_EXAMPLES = 100
FUZZ_SEED = 20261129
MIN_VALID_RATE = 0.5  # schemathesis warns below 0.2


def test_openapi_describes_every_route_and_documents_openai_errors(server: ServerProcess) -> None:
    spec = httpx.get(f"{server.base_url}/openapi.json").json()
    paths = spec["paths"]
    routes = {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/ready", "/metrics"}
    assert set(paths) == routes
    for route in ("/v1/completions", "/v1/chat/completions"):
        operation = paths[route]["post"]
        assert "422" not in operation["responses"], "validation errors are 400 here, not FastAPI's 422"
        for status in ("400", "401", "404", "408", "413", "415", "429", "500", "503", "504"):
            schema = operation["responses"][status]["content"]["application/json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/ErrorResponse"}, (route, status)
    assert "503" in paths["/ready"]["get"]["responses"]
    assert "HTTPValidationError" not in spec["components"]["schemas"]
    model = spec["components"]["schemas"]["CompletionRequest"]["properties"]["model"]
    assert model["enum"] == ["SmolLM2-135M-Instruct"]


def test_schema_fuzzing_finds_no_5xx_and_only_openai_errors(server: ServerProcess) -> None:
    rss_before = server.rss_mb()
    started = time.monotonic()
    report = fuzz(server.base_url, examples_per_operation(FUZZ_EXAMPLES), fuzz_seed(FUZZ_SEED))
    elapsed = time.monotonic() - started
    print(f"\n{report.summary()}\n  ({elapsed:.0f} s)")
    for (operation, mode), count in report.cases.items():
        LEDGER.cases[f"schema fuzzing {operation} [{mode}]"] += count
    LEDGER.statuses.update(report.statuses)
    refused = ", ".join(f"{code}: {n}" for code, n in report.schema_valid_refused.most_common(6))
    total = sum(report.cases.values())
    served = ", ".join(
        f"{operation} {report.valid_rate(operation):.0%}" for operation in sorted(report.schema_valid)
    )
    LEDGER.notes.append(
        f"schema fuzzing (seed {report.seed}): {total} cases in {elapsed:.0f} s; "
        f"schema-valid requests served: {served}; refused on semantic grounds: {refused or 'none'}"
    )
    LEDGER.observe_rss(server.rss_mb())
    assert report.server_errors == 0, report.summary()
    assert report.failures == [], report.summary()
    assert sum(report.cases.values()) >= 4 * min(FUZZ_EXAMPLES, examples_per_operation(FUZZ_EXAMPLES))
    for operation in ("POST /v1/completions", "POST /v1/chat/completions"):
        # The schema says what the server serves: no "mostly rejected generated data" warning.
        assert report.valid_rate(operation) >= MIN_VALID_RATE, report.summary()

    # Healthy afterwards: nothing left running in the engine, and a normal request works.
    left = server.wait_engine_idle(timeout_s=30)
    LEDGER.orphaned_engine_requests = max(LEDGER.orphaned_engine_requests, left)
    assert left == 0
    assert httpx.get(f"{server.base_url}/health").status_code == 200
    body = {"model": "SmolLM2-135M-Instruct", "prompt": "The capital of France is", "max_tokens": 2}
    assert httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60).status_code == 200
    assert server.rss_mb() - rss_before < 500, "fuzzing does not leak memory"
