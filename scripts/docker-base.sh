#!/usr/bin/env bash
# A stand-in for the official python:3.11-slim-bookworm image, made from Debian's own packages
# (Docker Hub cannot be reached here): debootstrap's minimal bookworm with Debian's Python 3.11,
# plus the host's extra CA certificates so pip and apt reach their registries through this
# machine's egress. docker/Dockerfile.cpu builds on it unchanged:
#   docker build --build-arg PYTHON_IMAGE=llmserve-local/python:3.11-bookworm ...
set -euo pipefail
tag=${1:-llmserve-local/python:3.11-bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

if docker image inspect "$tag" >/dev/null 2>&1; then
    echo "docker-base: $tag exists"
    exit 0
fi
root=$(mktemp -d /tmp/llmserve-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
started=$(date +%s)
debootstrap --variant=minbase \
    --include=python3,python3-venv,python3-dev,python-is-python3,ca-certificates \
    bookworm "$root" "$mirror" >/dev/null
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
    chroot "$root" update-ca-certificates >/dev/null
fi
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
chmod 755 "$root"  # the image's / (mktemp made it 0700: no one but root could reach /bin)
tar -C "$root" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
    --change 'CMD ["python3"]' \
    - "$tag" >/dev/null
echo "docker-base: built $tag in $(($(date +%s) - started)) s ($(docker image inspect "$tag" --format '{{.Size}}' | numfmt --to=iec))"
