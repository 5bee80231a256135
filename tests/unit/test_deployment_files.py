"""Docker images, the compose stack and the Kubernetes manifests: linted and schema-validated with the
field's own tools, and tied to the code (probe paths, ports, env vars, drain timing, metric names,
build steps). No Docker engine or cluster is needed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from fastapi.routing import APIRoute

from llmserve.app import create_app
from llmserve.config import load_config
from llmserve.engine.vllm_engine import ENGINE_STOP_TIMEOUT_S
from llmserve.server_group import EXIT_GRACE_S
from tests.fake_engine import FakeEngine, fake_starter

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
BIN = Path(sys.executable).parent
DOCKERFILES = sorted(DOCKER.glob("Dockerfile.*"))
K8S_FILES = sorted((DOCKER / "k8s").glob("*.yaml"))
K8S_VERSION = "1.30.0"  # preStop.sleep (used for the drain) is GA from 1.30: the oldest we support


def k8s_documents() -> list[tuple[Path, dict[str, Any]]]:
    return [(path, doc) for path in K8S_FILES for doc in yaml.safe_load_all(path.read_text()) if doc]


def compose() -> dict[str, Any]:
    return dict(yaml.safe_load((DOCKER / "compose.yaml").read_text()))


def app_routes() -> set[str]:
    app = create_app(load_config(), fake_starter(FakeEngine()))
    return {route.path for route in app.routes if isinstance(route, APIRoute)}


def pod_specs() -> list[tuple[str, dict[str, Any]]]:
    """Every pod template in the manifests: Deployments' and KubeRay head/worker groups'."""
    specs = []
    for path, doc in k8s_documents():
        if doc["kind"] == "Deployment":
            specs.append((f"{path.name}:{doc['metadata']['name']}", doc["spec"]["template"]))
        if doc["kind"] == "RayCluster":
            specs.append((f"{path.name}:head", doc["spec"]["headGroupSpec"]["template"]))
            for group in doc["spec"]["workerGroupSpecs"]:
                specs.append((f"{path.name}:{group['groupName']}", group["template"]))
    return specs


def serving_containers() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(where, pod template, container) for every container that runs llmserve."""
    found = []
    for where, template in pod_specs():
        for container in template["spec"]["containers"]:
            if "readinessProbe" in container:
                found.append((where, template, container))
    return found


# ---- the field's own linters and validators -------------------------------------------------


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=[p.name for p in DOCKERFILES])
def test_hadolint_is_clean(dockerfile: Path) -> None:
    result = subprocess.run(
        [str(BIN / "hadolint"), str(dockerfile)], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_file_validates_against_the_compose_specification() -> None:
    command = [
        str(BIN / "check-jsonschema"),
        "--builtin-schema",
        "vendor.compose-spec",
        "docker/compose.yaml",
    ]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("manifest", K8S_FILES, ids=[p.name for p in K8S_FILES])
def test_kubernetes_manifests_validate_against_the_kubernetes_schemas(manifest: Path) -> None:
    for doc in yaml.safe_load_all(manifest.read_text()):
        if doc["apiVersion"] in ("ray.io/v1", "monitoring.coreos.com/v1"):
            continue  # custom resources: their pod templates are validated below
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_kuberay_pod_templates_validate_as_kubernetes_pod_templates() -> None:
    for _, template in pod_specs():
        wrapped = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template}
        kubernetes_validate.validate(wrapped, K8S_VERSION, strict=True)


# ---- deployment tied to the code ------------------------------------------------------------


def test_every_probe_and_scrape_path_is_a_route_of_the_server() -> None:
    routes = app_routes()
    paths = set()
    for _, _, container in serving_containers():
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            if probe in container:
                paths.add(container[probe]["httpGet"]["path"])
    for _, doc in k8s_documents():
        annotations = doc.get("metadata", {}).get("annotations", {})
        if "prometheus.io/path" in annotations:
            paths.add(annotations["prometheus.io/path"])
        for endpoint in doc.get("spec", {}).get("endpoints", []):
            paths.add(endpoint["path"])
    prometheus = yaml.safe_load((DOCKER / "prometheus" / "prometheus.yml").read_text())
    paths |= {job["metrics_path"] for job in prometheus["scrape_configs"]}
    for dockerfile in DOCKERFILES:
        paths |= set(re.findall(r"http://127\.0\.0\.1:8000(/\w+)", dockerfile.read_text()))
    assert paths >= {"/health", "/ready", "/metrics"}
    assert paths <= routes, paths - routes
    # Readiness must be the real probe; liveness must not restart a pod that is merely loading.
    for where, _, container in serving_containers():
        assert container["readinessProbe"]["httpGet"]["path"] == "/ready", where
        assert container["livenessProbe"]["httpGet"]["path"] == "/health", where


def test_ports_match_the_servers_port() -> None:
    port = load_config().server.port
    for where, _, container in serving_containers():
        http = next(p for p in container["ports"] if p["name"] == "http")
        assert http["containerPort"] == port, where
    for dockerfile in DOCKERFILES:
        assert f"EXPOSE {port}" in dockerfile.read_text()
    for name in ("llmserve", "llmserve-gpu"):
        assert any(mapping.endswith(f":{port}") for mapping in compose()["services"][name]["ports"])


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container.get("env", [])}


def all_env() -> list[tuple[str, dict[str, str]]]:
    envs = [(where, env_of(container)) for where, _, container in serving_containers()]
    for name, service in compose()["services"].items():
        envs.append((f"compose:{name}", {k: str(v) for k, v in (service.get("environment") or {}).items()}))
    for dockerfile in DOCKERFILES:
        block = re.findall(r"^ENV (.+?)(?<!\\)$", dockerfile.read_text(), flags=re.M | re.S)
        pairs = re.findall(r"(\w+)=(\S+)", " ".join(block))
        envs.append((dockerfile.name, dict(pairs)))
    return envs


def test_every_llmserve_env_var_is_a_config_key_and_the_rest_are_known(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    known_elsewhere = {"HF_HUB_OFFLINE", "VLLM_NO_USAGE_STATS", "VLLM_TARGET_DEVICE", "PATH", "HOME",
                       "PYTHONPATH", "PIP_NO_CACHE_DIR", "LLMSERVE_EXTRAS", "LLMSERVE_EDITABLE",
                       "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_TRUSTED_HOST",
                       "GF_AUTH_ANONYMOUS_ENABLED", "GF_AUTH_ANONYMOUS_ORG_ROLE",
                       "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"}  # fmt: skip
    for where, env in all_env():
        config_env = {k: v for k, v in env.items() if k.startswith("LLMSERVE_") and "__" in k}
        assert set(env) - set(config_env) <= known_elsewhere, (where, set(env) - set(config_env))
        with monkeypatch.context() as patched:
            for key, value in config_env.items():
                patched.setenv(key, value)
            load_config()  # unknown LLMSERVE_* keys are a ConfigError


def test_termination_grace_covers_pre_stop_the_drain_and_the_engines_stop() -> None:
    engine_stop_s = max(ENGINE_STOP_TIMEOUT_S, EXIT_GRACE_S)
    for where, template, container in serving_containers():
        env = env_of(container)
        args = " ".join(container.get("args", []))
        profile = REPO / "configs" / re.findall(r"configs/([\w.-]+\.yaml)", args)[0]
        drain_s = float(
            env.get("LLMSERVE_SERVER__SHUTDOWN_TIMEOUT_S", load_config(profile).server.shutdown_timeout_s)
        )
        assert drain_s == load_config(profile).server.shutdown_timeout_s, f"{where}: env and profile disagree"
        pre_stop_s = container["lifecycle"]["preStop"]["sleep"]["seconds"]
        grace = template["spec"]["terminationGracePeriodSeconds"]
        assert grace >= pre_stop_s + drain_s + engine_stop_s, where
    for name in ("llmserve", "llmserve-gpu"):
        grace = int(compose()["services"][name]["stop_grace_period"].removesuffix("s"))
        assert grace >= load_config().server.shutdown_timeout_s + engine_stop_s


def test_images_run_profiles_that_exist_and_fit_what_the_manifests_reserve() -> None:
    for where, _, container in serving_containers():
        profile_name = re.findall(r"configs/([\w.-]+\.yaml)", " ".join(container.get("args", [])))[0]
        engine = load_config(REPO / "configs" / profile_name).engine
        gpus = int(container["resources"]["limits"]["nvidia.com/gpu"])
        per_node = engine.world_size if engine.distributed_executor_backend != "ray" else gpus
        assert gpus == min(per_node, engine.world_size), where
    gpu = compose()["services"]["llmserve-gpu"]
    profile_name = re.findall(r"configs/([\w.-]+\.yaml)", " ".join(gpu["command"]))[0]
    engine = load_config(REPO / "configs" / profile_name).engine
    assert gpu["deploy"]["resources"]["reservations"]["devices"][0]["count"] == engine.tensor_parallel_size
    assert gpu.get("ipc") == "host" or "shm_size" in gpu, "NCCL needs shared memory"


def test_the_hpa_scales_on_a_metric_the_gateway_exports() -> None:
    from prometheus_client import generate_latest

    from llmserve.metrics import GatewayMetrics

    exposition = generate_latest(GatewayMetrics("m").registry).decode()
    for _, doc in k8s_documents():
        if doc["kind"] == "HorizontalPodAutoscaler":
            for metric in doc["spec"]["metrics"]:
                assert f"# TYPE {metric['pods']['metric']['name']} gauge" in exposition


def test_the_cpu_image_builds_with_the_commands_make_serve_runs() -> None:
    dockerfile = (DOCKER / "Dockerfile.cpu").read_text()
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^serve: model$", makefile, flags=re.M), "make serve prepares the model first"
    assert re.search(r"&& make model VENV=", dockerfile), "the image runs the same target"
    build = dockerfile.split("AS runtime", 1)[0]
    assert build.index("scripts/setup-venv.sh /opt/llmserve/venv") < build.index("COPY . ."), (
        "dependencies are a layer of their own, before the sources: a source change does not rebuild it"
    )
    deps = build.split("AS deps", 1)[1].split("AS build", 1)[0]
    assert "scripts/setup-venv.sh /opt/llmserve/venv" in deps
    assert "COPY . ." not in deps, "make docker-test builds the dependency stage from changed sources"
    assert "--target deps" in (REPO / "scripts" / "docker-build.sh").read_text()
    assert '"/usr/bin/tini", "--"' in dockerfile, "PID 1 forwards signals and reaps children"
    assert "scripts/setup-venv.sh $(VENV)" in makefile
    assert "prepare-model --output $(MODEL_DIR)" in makefile
    runtime = dockerfile.split("AS runtime", 1)[1]
    assert "gcc" not in runtime, "the runtime stage carries no build tools"
    for dockerfile_path in DOCKERFILES:
        text = dockerfile_path.read_text()
        assert re.search(r"^USER 10001", text, flags=re.M), f"{dockerfile_path.name} runs as non-root"
        assert "HEALTHCHECK" in text
        assert not re.search(r"(API_KEY|SECRET|TOKEN|PASSWORD)\s*=", text), "no secrets baked in"


def test_the_compose_loadtest_profile_runs_the_repositorys_locustfile() -> None:
    services = compose()["services"]
    for name in ("locust-master", "locust-worker"):
        assert services[name]["profiles"] == ["loadtest"]
        assert (REPO / services[name]["command"][1]).exists()


def test_every_way_to_run_a_server_gives_vllm_its_shared_memory() -> None:
    """vLLM's engine core and worker share a 160 MiB ring in /dev/shm; Docker's default is 64 MiB,
    where the engine fails at start (`make docker-test` found it)."""
    for name in ("llmserve", "llmserve-gpu"):
        service = compose()["services"][name]
        assert service.get("ipc") == "host" or "shm_size" in service, name
    for where, pod in pod_specs():
        mounts = [m["mountPath"] for c in pod["spec"]["containers"] for m in c.get("volumeMounts", [])]
        assert "/dev/shm" in mounts, where
    documented = "".join(
        path.read_text()
        for path in (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *DOCKER.glob("Dockerfile.*"))
    )
    for command in re.findall(r"docker run [^\n`]*", documented):
        assert "--shm-size" in command or "--ipc=host" in command, command
