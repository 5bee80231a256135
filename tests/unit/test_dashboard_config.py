"""The Grafana dashboard, Prometheus scrape config and compose stack refer to what the server exposes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from llmserve.config import load_config
from llmserve.metrics import GatewayMetrics

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
DASHBOARD = json.loads((DOCKER / "grafana/dashboards/llmserve.json").read_text())
METRIC_NAME = re.compile(r"\b(llmserve_[a-z0-9_]+|vllm:[a-z0-9_]+)")
SAMPLE_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def dashboard_exprs() -> list[str]:
    return [target["expr"] for panel in DASHBOARD["panels"] for target in panel["targets"]]


def gateway_series_names() -> set[str]:
    """Every sample name the gateway can export, whether or not it has been observed yet."""
    families = GatewayMetrics("m").registry.collect()
    return {family.name + suffix for family in families for suffix in SAMPLE_SUFFIXES[family.type]}


def vllm_metric_sources() -> str:
    import vllm

    root = Path(vllm.__file__).parent / "v1"
    return (
        "\n".join(path.read_text() for path in (root / "metrics").glob("*.py"))
        + (root / "spec_decode" / "metrics.py").read_text()
    )


@pytest.mark.parametrize("expr", dashboard_exprs())
def test_every_dashboard_query_names_series_that_exist(expr: str) -> None:
    gateway, vllm_sources = gateway_series_names(), vllm_metric_sources()
    names = METRIC_NAME.findall(expr)
    assert names, expr
    for name in names:
        if name.startswith("llmserve_"):
            assert name in gateway, f"{name} is not a gateway series"
        else:
            base = re.sub(r"_(total|bucket|sum|count)$", "", name)
            assert f'"{base}"' in vllm_sources, f"{name} is not defined by the installed vLLM"


def test_dashboard_has_the_panels_an_slo_needs() -> None:
    titles = {panel["title"] for panel in DASHBOARD["panels"]}
    for wanted in (
        "Requests per second by status",
        "Errors and rejections per second",
        "End-to-end latency (SLO 200 ms)",
        "Time to first token",
        "Time per output token",
        "Queue depth",
        "KV cache usage",
        "Speculative decoding acceptance",
    ):
        assert wanted in titles
    speculation = next(p for p in DASHBOARD["panels"] if p["title"] == "Speculative decoding acceptance")
    assert {t["legendFormat"] for t in speculation["targets"]} == {"acceptance rate", "mean accepted length"}
    latency = next(p for p in DASHBOARD["panels"] if p["title"].startswith("End-to-end latency"))
    steps = latency["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert any(step["value"] == 0.2 for step in steps), "the 200 ms SLO line"
    assert {t["legendFormat"] for t in latency["targets"]} == {"p50", "p95", "p99"}


def test_prometheus_scrapes_the_servers_metrics_path_and_port() -> None:
    scrape = yaml.safe_load((DOCKER / "prometheus/prometheus.yml").read_text())["scrape_configs"][0]
    assert scrape["metrics_path"] == "/metrics"
    port = load_config().server.port
    assert scrape["static_configs"][0]["targets"] == [f"llmserve:{port}", f"llmserve-gpu:{port}"]


def test_compose_wires_llmserve_prometheus_and_grafana_with_files_that_exist() -> None:
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    assert {"llmserve", "prometheus", "grafana"} <= set(services)
    assert (DOCKER / ".." / services["llmserve"]["build"]["dockerfile"]).resolve().is_file()
    for service in services.values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("${"):
                continue  # the host's model directory, chosen by the operator
            assert (DOCKER / source).exists(), source
    datasource = yaml.safe_load((DOCKER / "grafana/provisioning/datasources/prometheus.yaml").read_text())
    uids = {target["datasource"]["uid"] for panel in DASHBOARD["panels"] for target in panel["targets"]}
    assert uids == {datasource["datasources"][0]["uid"]}
