#!/usr/bin/env bash
# The container runtime that the `containers` tests (tests/deploy/test_compose_run.py,
# test_systemd_run.py) use: Debian's podman with runc, netavark and aardvark-dns (container names
# resolve on a compose network), iptables (netavark's firewall driver: without it every container
# start fails with "netavark: No such file or directory"; podman only recommends it, and recommends
# are not installed), and debootstrap (deploy/build-local-base.sh). Idempotent: installs
# only what is missing. Run as root on Debian/Ubuntu; .ci/run calls it before those tests, and the
# tests call it themselves when podman is missing.
#
# It also writes /etc/containers/containers.conf.d/50-rlfleet.conf for hosts like CI's and the
# development machine (no systemd as PID 1, cgroup v1, hard limits below podman's defaults):
# runc (crun fails there: "cgroups in hybrid mode not supported"), cgroupfs, netavark, and no
# default ulimits (podman's default open-files limit is above the host's hard limit).
set -euo pipefail

declare -A PROVIDES=([podman]=podman [runc]=runc [debootstrap]=debootstrap [iptables]=iptables
                     [/usr/lib/podman/netavark]=netavark [/usr/lib/podman/aardvark-dns]=aardvark-dns)
missing=()
for tool in "${!PROVIDES[@]}"; do
    if [[ $tool == /* ]]; then [[ -x $tool ]] || missing+=("${PROVIDES[$tool]}")
    else command -v "$tool" > /dev/null || missing+=("${PROVIDES[$tool]}"); fi
done
conf=/etc/containers/containers.conf.d/50-rlfleet.conf
if ((${#missing[@]} == 0)) && [[ -f $conf ]]; then
    echo "tests/deploy: podman, runc, netavark, aardvark-dns, iptables and debootstrap are installed"
    exit 0
fi
if [[ $(id -u) != 0 ]] || ! command -v apt-get > /dev/null; then
    echo "tests/deploy: missing ${missing[*]:-$conf}: run this script as root on Debian/Ubuntu" >&2
    exit 1
fi
start=$SECONDS
if ((${#missing[@]})); then
    mapfile -t packages < <(printf '%s\n' "${missing[@]}" | sort -u)
    echo "tests/deploy: installing ${packages[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q > /dev/null
    apt-get install -y -q --no-install-recommends "${packages[@]}" > /dev/null
fi
if [[ ! -f $conf ]]; then
    mkdir -p "$(dirname "$conf")"
    cat > "$conf" << 'EOF'
# Written by rlfleet's tests/deploy/install-container-runtime.sh.
[containers]
default_ulimits = []
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
[network]
network_backend = "netavark"
EOF
fi
echo "tests/deploy: container runtime ready in $((SECONDS - start)) s"
