#!/usr/bin/env bash
# Every GPU figure of bench/RESULTS.md, in two device calls of under 10 minutes each
# (nvidia-h200-x2, carry .whl: the wheels the GPU image lacks, see bench/RESULTS.md):
#   bash bench/gpu_session.sh core   gpu tests, rollout decode, weight sync, learner throughput
#   bash bench/gpu_session.sh e2e    rlfleet async / sync / TRL, the same GRPO job
# Outputs go to $OUT (the device tool's folder) or ./bench-out.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-bench-out}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"

step() {  # step NAME SECONDS COMMAND...: run with a time limit, keep its output
  local name=$1 limit=$2; shift 2
  echo "=== $name"
  timeout "$limit" "$@" 2>&1 | tee "$out/$name.txt" | tail -25
}

case "${1:-core}" in
  core)
    step rollout 120 python3 bench/rollout_throughput.py
    step weight_sync 90 python3 bench/weight_sync.py --shapes 0.5b,1.5b,7b
    step learner 120 python3 bench/learner_throughput.py --out "$out/learner.json"
    step gpu_tests 200 python3 -m pytest -p no:cacheprovider -q -o addopts="" -m gpu tests/gpu
    ;;
  e2e)
    step e2e 540 python3 bench/e2e_grpo.py --out "$out/e2e_grpo.json"
    ;;
  *) echo "usage: $0 core|e2e" >&2; exit 2 ;;
esac
