#!/usr/bin/env bash
# A base image for deploy/Dockerfile built from Debian packages alone, for hosts that reach no image
# registry (only a Debian mirror): debootstrap makes a Debian bookworm root file system with Python
# 3.11 (the official python:3.11-slim-bookworm's version), a virtual environment in /opt/python
# comes first on PATH (so `pip install` works as in the official image), and `podman import`
# turns the folder into an image. Then:
#   podman build --build-arg BASE_IMAGE=localhost/rlfleet-base:bookworm --build-arg DEVICE=cpu \
#       -f deploy/Dockerfile -t rlfleet:cpu .
# (deploy/build-cpu-image.sh does both). Reuses the image when the machine has it (--force rebuilds).
#
#   deploy/build-local-base.sh [--force] [IMAGE]     IMAGE defaults to localhost/rlfleet-base:bookworm
#
# Needs root, debootstrap and podman (`apt-get install podman runc debootstrap`). About 3 minutes
# and 260 MB (docs/deployment/compose.md has the figures). DEBIAN_MIRROR picks the mirror.
set -euo pipefail

force=0
if [[ ${1:-} == --force ]]; then
    force=1
    shift
fi
image=${1:-localhost/rlfleet-base:bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

if ((!force)) && podman image exists "$image"; then
    echo "build-local-base: $image is already here (--force rebuilds it)"
    exit 0
fi
for tool in debootstrap podman; do
    command -v "$tool" > /dev/null || {
        echo "build-local-base: $tool is missing: apt-get install podman runc debootstrap" >&2
        exit 1
    }
done
[[ $(id -u) == 0 ]] || {
    echo "build-local-base: debootstrap needs root" >&2
    exit 1
}

start=$SECONDS
root=$(mktemp -d /var/tmp/rlfleet-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
# minbase: dpkg, apt and the required packages only; ca-certificates so pip and apt reach HTTPS.
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$root" "$mirror"
# The official image's pip installs system-wide; Debian's python forbids that (PEP 668), so the
# image's Python is a virtual environment, first on PATH.
chroot "$root" python3 -m venv /opt/python
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" -c . | podman import \
    --change 'ENV PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    --message "Debian bookworm (debootstrap minbase) + python3 venv in /opt/python" \
    - "$image" > /dev/null
echo "build-local-base: built $image in $((SECONDS - start)) s"
