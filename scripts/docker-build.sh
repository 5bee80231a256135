#!/usr/bin/env bash
# Builds the CPU image (and a Prometheus image) here, for `make docker-test`, and reports what an
# ops team asks: build time cold and warm, image size, build context size, and whether a source
# change reuses the dependency layer.
#
# docker/Dockerfile.cpu builds unchanged: only its build arguments point elsewhere. The base is
# scripts/docker-base.sh's image from Debian's packages (Docker Hub cannot be reached here), and pip
# reads this machine's package mirror (/opt/pypi, /opt/wheels: torch's CPU build lies there, as
# download.pytorch.org cannot be reached), served over loopback for the build's host network.
set -euo pipefail
cd "$(dirname "$0")/.."
image=${LLMSERVE_DOCKER_IMAGE:-llmserve:cpu}
base=${LLMSERVE_DOCKER_BASE:-llmserve-local/python:3.11-bookworm}
port=${LLMSERVE_MIRROR_PORT:-8765}

args=(--network host --build-arg "PYTHON_IMAGE=$base")
if [ -d /opt/pypi/simple ]; then
    python3 -m http.server --bind 127.0.0.1 --directory /opt "$port" >/dev/null 2>&1 &
    mirror=$!
    trap 'kill $mirror 2>/dev/null || true' EXIT
    extra="http://127.0.0.1:$port/pypi/simple"
    [ -d /opt/pypi-more/simple ] && extra="$extra http://127.0.0.1:$port/pypi-more/simple"
    args+=(--build-arg "PIP_EXTRA_INDEX_URL=$extra" --build-arg "PIP_TRUSTED_HOST=127.0.0.1")
    [ -d /opt/wheels ] && args+=(--build-arg "PIP_FIND_LINKS=http://127.0.0.1:$port/wheels/")
    sleep 1
fi

build() {  # build <tag> <log> <docker build arguments...>
    local tag=$1 log=$2 started=$SECONDS
    shift 2
    if ! docker build -t "$tag" "$@" >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        echo "docker-build: building $tag failed (log: $log)" >&2
        exit 1
    fi
    echo $((SECONDS - started))
}

cold_log=/tmp/llmserve-docker-build.log
previous=$(docker image inspect "$image" --format '{{.Id}}' 2>/dev/null || true)
seconds=$(build "$image" "$cold_log" "${args[@]}" -f docker/Dockerfile.cpu .)
# The image it replaces, without touching the layers the next build takes from the cache (the
# vfs storage driver stores every layer as a full copy: ~3 GB each).
current=$(docker image inspect "$image" --format '{{.Id}}')
if [ -n "$previous" ] && [ "$previous" != "$current" ]; then
    docker image rm "$previous" >/dev/null 2>&1 || true
fi
context=$(grep -o 'Sending build context to Docker daemon *[0-9.]*[kMG]*B' "$cold_log" | awk '{print $NF}' || true)
size=$(docker image inspect "$image" --format '{{.Size}}' | numfmt --to=iec)
echo "docker-build: $image in ${seconds} s ($([ -n "$previous" ] && echo 'layers cached from an earlier build' || echo cold)); image $size; build context ${context:-?}"

# A source change: the dependency layer must come from the cache.
context_dir=$(mktemp -d /tmp/llmserve-context.XXXXXX)
trap 'kill ${mirror:-} 2>/dev/null || true; rm -rf "$context_dir"' EXIT
git ls-files -z | xargs -0 cp --parents -t "$context_dir"
echo "# changed $(date +%s)" >>"$context_dir/src/llmserve/__init__.py"
warm_log=/tmp/llmserve-docker-build-warm.log
dangling_before=$(docker images --filter dangling=true --quiet --no-trunc | sort)
seconds=$(build "$image-warm-check" "$warm_log" "${args[@]}" -f "$context_dir/docker/Dockerfile.cpu" "$context_dir")
docker image rm "$image-warm-check" >/dev/null
# ...and the build stage it left untagged (its layers shared with the real build stay).
comm -13 <(echo "$dangling_before") <(docker images --filter dangling=true --quiet --no-trunc | sort) \
    | xargs -r docker image rm >/dev/null 2>&1 || true
if ! grep -A2 'scripts/setup-venv.sh /opt/llmserve/venv' "$warm_log" | grep -q 'Using cache'; then
    echo "docker-build: a source change rebuilt the dependency layer (log: $warm_log)" >&2
    exit 1
fi
echo "docker-build: after a source change, ${seconds} s (the dependency layer came from the cache)"

seconds=$(build llmserve-local/prometheus:debian /tmp/llmserve-docker-prometheus.log --network host \
    --build-arg "BASE_IMAGE=$base" -f docker/prometheus/Dockerfile.debian docker/prometheus)
echo "docker-build: llmserve-local/prometheus:debian (Debian's prometheus package) in ${seconds} s"
