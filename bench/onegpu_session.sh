#!/usr/bin/env bash
# The one-GPU session (issue: one GPU, first class) on the nvidia-h200 device machine, in back-to-back
# device calls (the machine keeps /tmp for ~30 s after a call):
#   carry [.carry/p0]            bash bench/onegpu_session.sh part0        first half of the GGUF to /tmp
#   carry [.carry/p1 .whl]       bash bench/onegpu_session.sh setup tests weights "run 0 60 20" "run 1 40 0" ...
# Phases, run in the order given:
#   setup        joins the GGUF, imports SmolLM2-135M, writes the arithmetic task (20,000 train, 500 test)
#   tests        the gpu tests of the one-GPU handoff (tests/gpu/test_weight_ipc.py)
#   weights      bench/weight_sync.py --device onegpu: CUDA IPC vs gloo through host memory, 135M and 0.5B
#   "run S N E"  rlfleet run of the arithmetic job at max_staleness=S for N steps, evaluating every E (0: never)
#   "trl N"      bench/gsm8k_trl.py on the same job for N steps (saving the model at the end), then rlfleet eval
#   profile      bench/onegpu_profile.py: decode (graphs vs compiled step) and learner variants on the real job
#   "calculator N [key=value ...]"  the calculator recipe (docs/recipes/calculator-smollm2.md) on setup's
#                model and data: rlfleet eval of the base model without and with the tool, N steps of
#                rlfleet run (which serves the calculator itself; rlfleet eval serves it in-process), the
#                trained model evaluated both ways; a table (bench/calculator_table.py). The overrides go
#                to every command (a CPU dry run: tests/bench/test_onegpu_calculator.py)
#   "bench ..."  any python bench/... command line
# .carry/: `split -n 2 -d SmolLM2-135M-Instruct.Q4_1.gguf gguf.part` (halves in p0/ and p1/); .whl/:
# bench/make_wheels.sh. Outputs (metrics, reports, logs) go to $OUT. RLFLEET_ONEGPU_WORK moves the work
# folder (default /tmp/rlfleet-onegpu).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-bench-out}
work=${RLFLEET_ONEGPU_WORK:-/tmp/rlfleet-onegpu}
mkdir -p "$out" "$work"
job=(--config deploy/configs/gsm8k-smollm2-135m.yaml "model.path=$work/models/smollm2-135m"
     "data.train_files=[$work/data/train.parquet]" "data.val_files=[$work/data/test.parquet]"
     "run.output_dir=$work/outputs" rollout.max_new_tokens=128 learner.lr=2.0e-5 reward.fn=auto
     learner.checkpoint_every=0)

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/*.whl >/dev/null 2>&1 || echo "wheel install failed (already installed?)"
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 TQDM_DISABLE=1
rlfleet() { python3 -m rlfleet.app.cli "$@"; }
quiet() { grep -v "Warning\|warn(\|UserWarning"; }

# calculator N [key=value ...]: see the header. Each command has its own timeout (150 s per evaluation,
# 330 s for the training run); 16 training samples per step are kept (samples-calc-N.jsonl).
calculator() {
  local n=$1 name=calc-$1 t
  shift
  local calc=(--config deploy/configs/calculator-smollm2-135m.yaml "model.path=$work/models/smollm2-135m"
              "data.train_files=[$work/data/train.parquet]" "data.val_files=[$work/data/test.parquet]"
              "run.output_dir=$work/outputs")
  local no_tool=(env.name=null "rollout.stop=[]")  # the single-turn recipe's prompts and sampling
  evaluate() {  # evaluate MODEL REPORT [key=value ...]
    t=$SECONDS
    timeout 150 python3 -m rlfleet.app.cli eval "${calc[@]}" --model "$1" --output "$out/$2" "${@:3}" 2>&1 \
      | quiet | grep -v "^rlfleet: report" | tail -3
    echo "--- eval $2: $((SECONDS - t)) s"
  }
  evaluate "$work/models/smollm2-135m" calc-base-notool.json "$@" "${no_tool[@]}"
  evaluate "$work/models/smollm2-135m" calc-base-tool.json "$@"
  t=$SECONDS
  timeout 330 python3 -m rlfleet.app.cli run "${calc[@]}" run.name="$name" controller.max_steps="$n" \
    controller.eval_every=0 controller.eval_before_train=false learner.checkpoint_every=0 \
    controller.samples_per_step=16 "$@" 2>&1 \
    | quiet | grep -v '"event": "step"' | tail -6
  echo "--- run: $((SECONDS - t)) s"
  cp "$work/outputs/$name/metrics.jsonl" "$out/metrics-$name.jsonl"
  cp "$work/outputs/$name/samples/train.jsonl" "$out/samples-$name.jsonl" 2>/dev/null
  evaluate "$work/outputs/$name" calc-trained-notool.json "$@" "${no_tool[@]}"
  evaluate "$work/outputs/$name" calc-trained-tool.json "$@"
  python3 bench/calculator_table.py --evals "$out"/calc-{base-notool,base-tool,trained-notool,trained-tool}.json \
    --metrics "$out/metrics-$name.jsonl" --out "$out/calculator-summary.json"
}

phase() {
  local t0=$SECONDS
  echo "=== $* ($(date +%T))"
  case "$1" in
    part0) cp .carry/p0/gguf.part00 "$work/" && ls -la "$work" ;;
    setup)
      cat "$work/gguf.part00" .carry/p1/gguf.part01 > "$work/smol.gguf" || return 1
      rlfleet model import "$work/smol.gguf" --output "$work/models/smollm2-135m" --force 2>&1 | quiet | tail -2
      rlfleet data arithmetic --output "$work/data/train.parquet" --rows 20000 2>&1 | tail -1
      rlfleet data arithmetic --output "$work/data/test.parquet" --rows 500 --split test 2>&1 | tail -1 ;;
    tests) timeout 420 python3 -m pytest -q -m gpu tests/gpu/test_weight_ipc.py tests/gpu/test_fast_rollout.py \
             tests/gpu/test_fused_kernels.py -p no:cacheprovider 2>&1 | tail -8 ;;
    profile) timeout 420 python3 bench/onegpu_profile.py --model "$work/models/smollm2-135m" \
               --data "$work/data/train.parquet" --out "$out/onegpu_profile.json" 2>&1 | quiet | grep -v "^Loading" ;;
    weights) timeout 300 python3 bench/weight_sync.py --device onegpu --shapes 135m,0.5b --reps 10 \
               --out "$out/weight_sync_onegpu.json" 2>&1 | quiet ;;
    run)
      local name="s$2-$3-$4"
      timeout 420 python3 -m rlfleet.app.cli run "${job[@]}" run.name="$name" controller.max_staleness="$2" \
        controller.max_steps="$3" controller.eval_every="$4" "controller.eval_before_train=$([ "$4" = 0 ] \
        && echo false || echo true)" "${@:5}" 2>&1 | quiet | grep -v '"event": "step"' | tail -12
      cp "$work/outputs/$name/metrics.jsonl" "$out/metrics-$name.jsonl"
      grep -h "transport\|memory plan" "$work/outputs/$name/logs/"*.log | head -4 ;;
    trl)
      timeout 540 python3 bench/gsm8k_trl.py "${job[@]}" --out "$work/trl" --max-steps "$2" 2>&1 | quiet | tail -6
      cp "$work/trl/trl_steps.jsonl" "$out/"
      rlfleet eval "${job[@]}" --model "$work/trl/model" --output "$out/trl_eval.json" 2>&1 | quiet | tail -4 ;;
    calculator) calculator "${@:2}" ;;
    bench) shift; timeout 300 python3 "$@" 2>&1 | quiet | tail -15 ;;
    *) echo "unknown phase $1" ;;
  esac
  echo "=== $1 took $((SECONDS - t0)) s"
}

for p in "$@"; do
  # shellcheck disable=SC2086
  phase $p
done
