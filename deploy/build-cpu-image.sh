#!/usr/bin/env bash
# The CPU image (rlfleet:cpu) built with podman on a host that reaches no image registry: the base
# comes from deploy/build-local-base.sh (Debian packages), Python packages from the package index.
#
#   deploy/build-cpu-image.sh [IMAGE]          IMAGE defaults to localhost/rlfleet:cpu
#
# Environment:
#   BASE_IMAGE    the base (default localhost/rlfleet-base:bookworm, built when missing);
#                 python:3.11-slim-bookworm where a registry is reachable
#   TORCH_WHEELS  a host folder holding the torch CPU wheel, searched before TORCH_CPU_INDEX
#   TORCH_CPU_INDEX  the index torch (and its dependencies) come from
#                 (default: PyTorch's CPU index; https://pypi.org/simple with TORCH_WHEELS)
#   PIP_CERT      a CA bundle pip must trust (a proxy that re-signs TLS): mounted for the build only
#
# Builds from the checkout this script is in; podman's layer cache makes a rebuild after a
# source change take only the rlfleet layer. Needs root (rootful podman, as the tests use it).
set -euo pipefail
cd "$(dirname "$0")/.."

image=${1:-localhost/rlfleet:cpu}
base=${BASE_IMAGE:-localhost/rlfleet-base:bookworm}
if [[ $base == localhost/rlfleet-base:* ]]; then
    bash deploy/build-local-base.sh "$base"
fi

# docker format: the OCI format has no SHELL, which the Dockerfile uses (bash arrays).
args=(--format docker --network host --build-arg BASE_IMAGE="$base" --build-arg DEVICE=cpu)
if [[ -n ${TORCH_WHEELS:-} ]]; then
    args+=(-v "$(realpath "$TORCH_WHEELS"):/wheels:ro" --build-arg TORCH_WHEELS=/wheels
           --build-arg TORCH_CPU_INDEX="${TORCH_CPU_INDEX:-https://pypi.org/simple}")
elif [[ -n ${TORCH_CPU_INDEX:-} ]]; then
    args+=(--build-arg TORCH_CPU_INDEX="$TORCH_CPU_INDEX")
fi
if [[ -n ${PIP_CERT:-} ]]; then
    # pip reads /etc/pip.conf; both files are mounted for the build only, never stored in the image.
    # A fixed path, so every build mounts the same file (the layer cache then has nothing new to
    # weigh; a fresh temporary name each time is not worth the risk).
    conf=/tmp/rlfleet-build-pip.conf
    printf '[global]\ncert = /run/host-ca.crt\n' > "$conf"
    chmod 644 "$conf"
    args+=(-v "$(realpath "$PIP_CERT"):/run/host-ca.crt:ro" -v "$conf:/etc/pip.conf:ro")
fi

start=$SECONDS
podman build "${args[@]}" -f deploy/Dockerfile -t "$image" .
size=$(podman image inspect --format '{{.Size}}' "$image")
echo "build-cpu-image: $image built in $((SECONDS - start)) s, $((size / 1000000)) MB"
