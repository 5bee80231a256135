#!/usr/bin/env bash
# Makes sure a Docker engine answers, for `make docker-test`: uses the running one, or installs
# Debian's (docker.io, docker-compose, debootstrap) and starts dockerd with the vfs storage
# driver, which needs no overlay support from the kernel. Says why when it cannot.
set -euo pipefail

log=${DOCKERD_LOG:-/tmp/llmserve-dockerd.log}

if docker info >/dev/null 2>&1; then
    echo "docker-engine: using the running engine ($(docker version --format '{{.Server.Version}}'))"
    exit 0
fi

need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
if ((${#need[@]})); then
    if [ "$(id -u)" != 0 ]; then
        echo "docker-engine: cannot install ${need[*]}: not root and no Docker engine answers" >&2
        exit 1
    fi
    echo "docker-engine: installing ${need[*]} from Debian"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if [ "$(id -u)" != 0 ]; then
    echo "docker-engine: dockerd must run as root and no Docker engine answers" >&2
    exit 1
fi
echo "docker-engine: starting dockerd (storage driver vfs), log: $log"
nohup dockerd --storage-driver=vfs >"$log" 2>&1 &
for _ in $(seq 60); do
    if docker info >/dev/null 2>&1; then
        echo "docker-engine: ready ($(docker version --format '{{.Server.Version}}'))"
        exit 0
    fi
    if ! kill -0 $! 2>/dev/null; then
        break
    fi
    sleep 1
done
echo "docker-engine: dockerd did not come up; what it said last:" >&2
tail -n 20 "$log" >&2
exit 1
