# The commands the README names. Each sets up what is missing first (venv, model) and
# is quick the second time: the venv is rebuilt only when its inputs change.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
LLMSERVE := $(VENV)/bin/llmserve
CONFIG ?= configs/cpu-smollm2.yaml
MODEL_DIR ?= .cache/models/SmolLM2-135M-Instruct
VENV_STAMP := $(VENV)/.llmserve-stamp
VENV_INPUTS := pyproject.toml requirements/constraints.txt scripts/setup-venv.sh
PYTEST_ARGS ?=

export HF_HUB_OFFLINE := 1
export VLLM_NO_USAGE_STATS := 1
export VLLM_TARGET_DEVICE := cpu

.PHONY: docker-test help venv model serve test test-unit test-integration lint typecheck format clean dashboard-png bench-metrics bench-overload bench-overload-sustained bench-overload-sim bench bench-spec bench-frontend loadtest check-config fuzz

help:
	@echo "make serve   set up what is missing, prepare the model, serve on 127.0.0.1:8000"
	@echo "make test    set up what is missing, run the whole test suite"
	@echo "make lint    ruff + mypy (strict)"
	@echo "make dashboard-png   (server running) key dashboard panels as a PNG + /metrics scrape cost"
	@echo "make bench-spec  speculative decoding (ngram static/scheduled, suffix) vs plain vLLM, 1-64 streams"
	@echo "make bench-frontend  llmserve vs vllm serve (1 and 2 API servers): real CPU engine, then a SIMULATED H200 up to 1200 req/s"
	@echo "make bench-overload  goodput under overload: vllm serve vs llmserve without and with SLO admission"
	@echo "make bench-overload-sustained  the same at 2x and 3x capacity sustained for 60 s, no burst"
	@echo "make bench-overload-sim  the same at GPU rates (SIMULATED H200), mission SLO e2e 200 ms"
	@echo "make bench   baseline vs vLLM vs vLLM+ngram, offline and online, ratios + PNG (BENCH_SCALE=0.5; 1 doubles every count)"
	@echo "make loadtest  Locust: ceiling, a bounded run with the SLO gate, a sweep (SLO=mission|cpu-smollm2)"
	@echo "make fuzz    schema fuzzing of the real server, FUZZ_EXAMPLES=1000 cases per operation and mode"
	@echo "make check-config CONFIG=configs/...  validate a profile, print vLLM's engine arguments"
	@echo "make docker-test  build and run the CPU image for real (Docker engine, base from Debian packages)"

$(VENV_STAMP): $(VENV_INPUTS)
	scripts/setup-venv.sh $(VENV)

venv: $(VENV_STAMP)

model: $(VENV_STAMP)
	$(LLMSERVE) prepare-model --output $(MODEL_DIR)

serve: model
	$(LLMSERVE) serve --config $(CONFIG)

# The whole suite in the dtype `auto` picks on this CPU, then the tests that assert what the model
# says once more in the other dtype (bfloat16 on an AVX2-only CPU is emulated and slow: only those).
# The slowest steps are listed, so that a CI log shows where the time went on whichever CPU it ran.
test: model lint
	$(PY) -m pytest tests/unit tests/integration --durations=25 $(PYTEST_ARGS)
	LLMSERVE_TEST_DTYPE=other $(PY) -m pytest -m dtype_sensitive tests/integration $(PYTEST_ARGS)

test-unit: venv
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

test-integration: model
	$(PY) -m pytest tests/integration $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/ruff check src tests loadtest
	$(VENV)/bin/ruff format --check src tests loadtest
	$(VENV)/bin/mypy

format: venv
	$(VENV)/bin/ruff format src tests loadtest
	$(VENV)/bin/ruff check --fix src tests loadtest

# With a server running (make serve): render the dashboard's panels to a PNG under a bounded load,
# and report what a /metrics scrape costs under that load.
URL ?= http://127.0.0.1:8000
dashboard-png: venv
	$(PY) -m loadtest.dashboard_png --url $(URL) --duration 60 --load 16 --out results/dashboard.png

bench-metrics: dashboard-png

# Starts its own servers: vllm serve, llmserve without admission and with SLO admission, the same
# seeded Poisson loads (0.5x to 4x the measured capacity) and a burst after idle; ~20 min.
bench-overload: model
	$(PY) -m loadtest.goodput_bench --out results/goodput

# Sustained overload: 2x and 3x capacity for 60 s each, no burst (~15 min on the CPU engine). A
# 20 s load ends before an unthrottled queue makes requests wait the SLO; this one does not.
bench-overload-sustained: model
	$(PY) -m loadtest.goodput_bench --loads 2,3 --duration 60 --burst 0 --page overload-sustained \
		--out results/goodput-sustained

# The same at GPU rates with the mission SLO (e2e 200 ms): the simulated H200 behind all three
# servers (configs/sim-h200-smollm2.yaml; a SIMULATION of the forward pass only); ~10 min.
bench-overload-sim: model
	$(PY) -m loadtest.goodput_bench --profile configs/sim-h200-smollm2.yaml --e2e-slo 0.2 \
		--max-tokens 8,32 --duration 10 --capacity-duration 10 --idle 10 --out results/goodput-sim

# Starts its own engines and servers: the transformers baseline, vLLM, vLLM + ngram speculation.
BENCH_SCALE ?= 0.5
bench-spec: model
	$(PY) -m loadtest.spec_bench --out results/spec

# The front end at GPU rates: the real CPU engine at 16 connections (wrk), then the simulated H200
# (configs/sim-h200-smollm2.yaml) at offered rates up to 1200 req/s (hey); ~20 min. Needs wrk and
# hey (Debian packages).
bench-frontend: model
	$(PY) -m loadtest.frontend_bench --out results/frontend

bench: model
	$(PY) -m loadtest.engine_bench --scale $(BENCH_SCALE) --out results/bench

# Starts a server (or reuses URL=...) and stops it after: Locust ceiling, a bounded run gated by
# the SLO profile, and a sweep of the offered load. Exits 1 when the SLO is missed.
SLO ?= mission
LOADTEST_ARGS ?=
loadtest: model
	$(PY) -m loadtest.run_loadtest all --slo $(SLO) --out results/loadtest $(if $(filter command line,$(origin URL)),--url $(URL)) $(LOADTEST_ARGS)

# The schema fuzzing of `make test`, longer: FUZZ_EXAMPLES cases per operation and mode, with a
# new seed each run unless FUZZ_SEED=<the printed seed> seeds a rerun.
FUZZ_EXAMPLES ?= 1000
FUZZ_SEED ?= random
fuzz: model
	LLMSERVE_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) LLMSERVE_FUZZ_SEED=$(FUZZ_SEED) $(PY) -m pytest tests/integration/test_fuzz_real_engine.py -s -p no:cacheprovider --timeout 7200

# Builds and runs the CPU image for real: a Docker engine (started if none runs), a base image from
# Debian's packages, the image (cold and after a source change), then tests/docker as a user and an
# ops team would use it (README examples, probes, docker stop, compose with Prometheus).
docker-test: venv
	scripts/docker-engine.sh
	scripts/docker-base.sh
	scripts/docker-build.sh
	$(PY) -m pytest tests/docker -p no:cacheprovider $(PYTEST_ARGS)

check-config: venv
	$(LLMSERVE) check-config --config $(CONFIG)

clean:
	rm -rf $(VENV) .cache .pytest_cache .mypy_cache .ruff_cache
