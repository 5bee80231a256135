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
    if ! docker build --force-rm -t "$tag" "$@" >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        echo "docker-build: building $tag failed (log: $log); $(free_gb) GB free for Docker" >&2
        exit 1
    fi
    echo $((SECONDS - started))
}
docker_root=$(docker info --format '{{.DockerRootDir}}')
free_gb() { df --output=avail -BG "$docker_root" | tail -n 1 | tr -dc 0-9; }
# The vfs storage driver stores every layer and every container as a full copy (~3 GB each once
# the venv is in). Measured with vfs: a cold build keeps ~17 GB (the image and its build stage, the
# next build's cache); a build after a source change, with that cache, takes ~16 GB more until the
# images it replaces are removed. (The check after a source change builds only the cached
# dependency stage and takes nothing.)
driver=$(docker info --format '{{.Driver}}')
if [ "$driver" != vfs ]; then default_need=10  # layers share files: the venv is stored once
elif docker image inspect "$image-build" >/dev/null 2>&1; then default_need=20
else default_need=24; fi
needed_gb=${LLMSERVE_DOCKER_NEEDED_GB:-$default_need}
if [ "$(free_gb)" -lt "$needed_gb" ]; then
    docker system df >&2 || true
    echo "docker-build: $(free_gb) GB free in $docker_root, and a build needs ~$needed_gb GB with the" \
        "$driver storage driver: free some (docker image prune) and run again" >&2
    exit 1
fi
# Images and build stages of earlier runs, untagged once a newer build took their tag, and what an
# interrupted run left. Removed after the new build (not before: the layers they share with it are
# its cache), with every layer only they use.
ours() {
    docker history --no-trunc --format '{{.CreatedBy}}' "$1" 2>/dev/null \
        | grep -qE 'setup-venv.sh /opt/llmserve/venv|image.title=.?llmserve \(CPU\)'
}
stale=()
for id in $(docker images --filter dangling=true --quiet --no-trunc); do
    if ours "$id"; then stale+=("$id"); fi
done
# An interrupted run's check left its tag on the dependency stage, the parent of every image built
# here: untag it only (removing it by ID would force-remove the containers of those images).
docker image rm "$image-warm-check" >/dev/null 2>&1 || true
previous=$(docker image inspect "$image" --format '{{.Id}}' 2>/dev/null || true)
previous_stage=$(docker image inspect "$image-build" --format '{{.Id}}' 2>/dev/null || true)

cold_log=/tmp/llmserve-docker-build.log
seconds=$(build "$image" "$cold_log" "${args[@]}" -f docker/Dockerfile.cpu .)
# Its build stage tagged ($image-build), from the cache at once, so that it stays as the cache of
# the next build rather than being taken for a stale one.
build "$image-build" "$cold_log-stage" "${args[@]}" --target build -f docker/Dockerfile.cpu . >/dev/null
current=$(docker image inspect "$image" --format '{{.Id}}')
if [ -n "$previous" ] && [ "$previous" != "$current" ]; then stale+=("$previous"); fi
current_stage=$(docker image inspect "$image-build" --format '{{.Id}}')
if [ -n "$previous_stage" ] && [ "$previous_stage" != "$current_stage" ]; then stale+=("$previous_stage"); fi
for id in "${stale[@]}"; do
    # What an interrupted run left untagged may be exactly what this build produced: keep it.
    if [ "$id" = "$current" ] || [ "$id" = "$current_stage" ]; then continue; fi
    docker ps --all --quiet --filter "ancestor=$id" | xargs -r docker rm --force >/dev/null 2>&1 || true
    docker image rm "$id" >/dev/null 2>&1 || true
done
context=$(grep -o 'Sending build context to Docker daemon *[0-9.]*[kMG]*B' "$cold_log" | awk '{print $NF}' || true)
size=$(docker image inspect "$image" --format '{{.Size}}' | numfmt --to=iec)
echo "docker-build: $image in ${seconds} s ($([ -n "$previous" ] && echo 'layers cached from an earlier build' || echo cold)); image $size; build context ${context:-?}; ${#stale[@]} stale image(s) removed; $(free_gb) GB free for Docker"

# A source change: the dependency stage must come from the cache. Only that stage is built: the
# rest of a rebuild is the copy of the sources, the model and the runtime stage, several minutes
# of full copies with vfs that would show nothing more (a CI run on an AVX2 host spent 764 s there).
context_dir=$(mktemp -d /tmp/llmserve-context.XXXXXX)
trap 'kill ${mirror:-} 2>/dev/null || true; rm -rf "$context_dir"' EXIT
git ls-files -z | xargs -0 cp --parents -t "$context_dir"
echo "# changed $(date +%s)" >>"$context_dir/src/llmserve/__init__.py"
warm_log=/tmp/llmserve-docker-build-warm.log
dangling_before=$(docker images --filter dangling=true --quiet --no-trunc | sort)
seconds=$(build "$image-warm-check" "$warm_log" "${args[@]}" --target deps \
    -f "$context_dir/docker/Dockerfile.cpu" "$context_dir")
docker image rm "$image-warm-check" >/dev/null
# ...and whatever it left untagged (layers shared with the real build stay).
comm -13 <(echo "$dangling_before") <(docker images --filter dangling=true --quiet --no-trunc | sort) \
    | xargs -r docker image rm >/dev/null 2>&1 || true
if ! grep -A2 'scripts/setup-venv.sh /opt/llmserve/venv' "$warm_log" | grep -q 'Using cache'; then
    echo "docker-build: a source change rebuilt the dependency layer (log: $warm_log)" >&2
    exit 1
fi
echo "docker-build: after a source change, the dependency stage came from the cache (${seconds} s); $(free_gb) GB free for Docker"

seconds=$(build llmserve-local/prometheus:debian /tmp/llmserve-docker-prometheus.log --network host \
    --build-arg "BASE_IMAGE=$base" -f docker/prometheus/Dockerfile.debian docker/prometheus)
echo "docker-build: llmserve-local/prometheus:debian (Debian's prometheus package) in ${seconds} s"
