#!/usr/bin/env bash
# Debian packages that tests/deploy needs: systemd (systemd-analyze verifies the units), slurm-wlm
# and munge (a single-node Slurm cluster runs deploy/slurm/rlfleet.sbatch). Idempotent: installs
# only what is missing. Run as root on Debian/Ubuntu; .ci/run calls it before `make test`.
set -euo pipefail

declare -A PROVIDES=([systemd-analyze]=systemd [slurmctld]=slurm-wlm [slurmd]=slurm-wlm [sbatch]=slurm-wlm
                     [munged]=munge)
missing=()
for tool in "${!PROVIDES[@]}"; do
    command -v "$tool" > /dev/null || missing+=("${PROVIDES[$tool]}")
done
if ((${#missing[@]} == 0)); then
    echo "tests/deploy: systemd, slurm-wlm and munge are installed"
    exit 0
fi
if [[ $(id -u) != 0 ]] || ! command -v apt-get > /dev/null; then
    echo "tests/deploy: missing ${missing[*]} (the tests that need them will be skipped)" >&2
    exit 0
fi
mapfile -t packages < <(printf '%s\n' "${missing[@]}" | sort -u)
echo "tests/deploy: installing ${packages[*]}"
start=$SECONDS
export DEBIAN_FRONTEND=noninteractive
apt-get update -q > /dev/null
# The packages' own services are not wanted (the tests start the daemons themselves).
apt-get install -y -q --no-install-recommends "${packages[@]}" > /dev/null
echo "tests/deploy: installed ${packages[*]} in $((SECONDS - start)) s"
