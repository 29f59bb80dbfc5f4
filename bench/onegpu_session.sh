#!/usr/bin/env bash
# The one-GPU session (issue: one GPU, first class) on the nvidia-h200 device machine, in back-to-back
# device calls (the machine keeps /tmp for ~30 s after a call):
#   carry [.carry/p0]            bash bench/onegpu_session.sh part0        first half of the GGUF to /tmp
#   carry [.carry/p1 .whl]       bash bench/onegpu_session.sh setup tests weights "run 0 60 20" "run 1 40 0" ...
#   carry [.carry/p1 .whl]       bash bench/onegpu_session.sh setup "parity 40 3"     (issue 21, ~8 min)
#   carry [.whl]                 bash bench/onegpu_session.sh "staleness 40 3"        (next call, ~4-5 min)
#   carry [.carry/data .whl]     bash bench/onegpu_session.sh "sft-gsm8k 40"          (next call, ~4-5 min)
#   carry [.carry/p1 .whl]       bash bench/onegpu_session.sh setup                    (issue 33: the model)
#   carry [.whl .whl-rg]         bash bench/onegpu_session.sh "reasoning-gym-base chain_sum,basic_arithmetic,..." \
#                                  "reasoning-gym 80 TASK"                            (next call, ~6-7 min)
# Phases, run in the order given:
#   setup        joins the GGUF, imports SmolLM2-135M, writes the arithmetic task (20,000 train, 500 test)
#                and, with .carry/data/{train,test}.jsonl (GSM8K), the GSM8K Parquet files
#   tests        the one-GPU gpu tests: the IPC handoff, the graph-replayed decode loop (compiled regions,
#                finished-row compaction), Liger, the learner's memory metrics and compile, pulls during captures
#   weights      bench/weight_sync.py --device onegpu: CUDA IPC vs gloo through host memory, 135M and 0.5B
#   "run S N E [src=TGZ] [key=value ...]"  rlfleet run of the arithmetic job at max_staleness=S for N steps,
#                evaluating every E (0: never); src=TGZ runs a carried `git archive`'s code (before a change)
#   "inservice S N STEPS"  the run phase's job for N steps with the learner's train steps and the rollout's
#                generation calls STEPS (e.g. 8,9) traced by torch.profiler (rlfleet/profiling.py):
#                $OUT/inservice-S.tgz (tables and Chrome traces), the top of each table printed
#   "trl N [fast] [noeval]"  bench/gsm8k_trl.py on the same job for N steps (saving the model at the end), then
#                rlfleet eval (unless noeval); `fast`: TRL's fastest configuration here (gsm8k_trl.py --fast); the
#                flags in any order, the arm named trl or trl-fast;
#                $OUT/trl[-fast]_steps.jsonl and the median s/step printed
#   profile      bench/onegpu_profile.py: decode (graphs, compiled, compiled without finished-row compaction)
#                and learner variants on the real job
#   learner-gap  why the learner step took 0.90 s in the run and 0.50 s in the profile: the default
#                layout on fresh batches (shapes change each step), with and without the run's 0.60 cap
#   "calculator N [key=value ...]"  the calculator recipe (docs/recipes/calculator-smollm2.md) on setup's
#                model, in one call (~8-9 min with N=80): the hard arithmetic task (20,000 train, 500 test)
#                and 4,000 tool-use traces played against the calculator (rlfleet data traces), rlfleet sft
#                on the traces (2 epochs), N steps of GRPO from the SFT model (rlfleet run serving the
#                calculator in its own process); base, SFT and SFT+GRPO each evaluated without and with
#                the tool (rlfleet eval serves it in-process); $OUT/calculator-summary.json, the table
#                (bench/calculator_table.py) in calculator-table.txt, and calc-raw.tgz. The overrides go
#                to every command (a CPU dry run: tests/e2e/test_onegpu_calculator_phase.py)
#   "parity N SEEDS [E]"  all at once on the one GPU: SEEDS rlfleet runs of the arithmetic recipe at S=0
#                (run.seed 1..SEEDS, evaluating at step 0 and every E, default 20) and SEEDS TRL runs
#                (same seeds, the model saved every E steps and evaluated by `rlfleet eval` as soon as
#                it is written), the base model's evaluation (TRL's step 0); then bench/parity_table.py:
#                $OUT/parity.md, parity.json (mean ± sd over seeds, per seed) and parity-raw.tgz
#   "staleness N SEEDS [E]"  the same rlfleet runs at S=1 and S=2 (2 x SEEDS at once), no TRL:
#                $OUT/staleness.{md,json} (merged with the parity phase's results when those are in /tmp
#                from an earlier call) and staleness-raw.tgz
#   gsm8k-eval   the base model on all 1,319 GSM8K test problems (greedy, 256 tokens), its responses
#                scored under verl's strict rule (gsm8k), verl's flexible one and gsm8k_lenient:
#                $OUT/gsm8k-eval.{md,json}
#   "sft-gsm8k N [EPOCHS]"  rlfleet sft on GSM8K train (EPOCHS, default 1), then GRPO for N steps from
#                the SFT model while the SFT model is evaluated beside it; the three models under the three
#                rules: $OUT/sft-gsm8k.{md,json} and sft-gsm8k-raw.tgz
#   "reasoning-gym-base TASKS [ROWS] [model=NAME]"  the base model (setup's SmolLM2, or $work/models/NAME that
#                qwen-setup imported; its files tagged NAME) on ROWS (default 200) held-out questions of each of
#                the comma-separated reasoning-gym TASKS, one rlfleet eval of them all: the table of each task's
#                accuracy beside its majority-answer baseline and answer diversity ($OUT/rg-base[-NAME].json)
#   "reasoning-gym N TASK [sft=STEPS] [model=NAME] [key=value ...]"  the reasoning-gym recipe
#                (docs/recipes/reasoning-gym-smollm2.md) on setup's model or NAME (TASK `auto`: the task
#                bench/rg_pick_task.py picks, by accuracy over the baseline, from the rg-base[-NAME].json that
#                reasoning-gym-base wrote earlier in the same call; `sft=STEPS` first: a format warm start of
#                STEPS rlfleet sft steps on the train rows' <answer>-tagged answers, evaluated, and GRPO from
#                it, rg-TASK-sft.json and metrics-rg-TASK-sft.jsonl): TASK's data (20,000 train, 500 test), rlfleet eval of the base model, N
#                steps of rlfleet run (evaluating every 20), rlfleet eval of the trained model ($OUT/
#                rg-TASK-base.json, rg-TASK-trained.json, metrics-rg-TASK-N.jsonl); about 5 minutes for 80
#                steps. The overrides go to every command (a CPU dry run: tests/e2e/test_onegpu_session_cpu.py)
#   "chunk FILE..."  appends carried chunks of a real model's GGUF to $work/model.gguf, one device call each
#                (a chunk of <= 54 MB is all a call can carry beside the working tree; the calls go back to back,
#                so the machine, and /tmp, stay warm): bash bench/fetch_model.sh with FETCH_CHUNKS=.carry/q cuts them
#   "qwen-setup NAME"  checks $work/model.gguf is NAME (size and sha256, bench/model_parts.py; a wrong one is
#                refused, naming which), imports it to $work/models/NAME, writes the GSM8K Parquet files
#   "qwen-eval NAME"  NAME on all 1,319 GSM8K test problems (greedy, deploy/configs/gsm8k-NAME.yaml's 512
#                tokens) under verl's strict and flexible rules and gsm8k_lenient: $OUT/qwen-eval-NAME.{md,json}
#   "qwen-run NAME RUN [key=value ...]"  starts rlfleet run of deploy/configs/gsm8k-NAME.yaml in its own
#                process session (it outlives the call; later calls find it while the machine stays warm);
#                RLFLEET_PROFILE_STEPS, when set, traces those steps into $work/RUN-prof
#   "qwen-wait RUN SECONDS"  waits for RUN to end or SECONDS to pass, prints its steps and evaluations so far;
#                $OUT/metrics-RUN.jsonl, RUN-val.tgz (samples/val.jsonl, the logs, the profile traces)
#   "bench ..."  any python bench/... command line
#   "fleet-sim TAG [src=TGZ] ARGS..."  starts bench/fleet_sim.py ARGS (issue 44: the controller at fleet scale, on
#                this machine's CPU cores) in the background, its output under $work/fleet/TAG; src=TGZ runs the
#                code of a carried `git archive` (e.g. the commit before a change) instead of the working tree
#   "fleet-wait SECONDS"  waits for the started simulator runs to end (SECONDS at most): $OUT/fleet-TAG.json each
# .carry/: `split -n 2 -d SmolLM2-135M-Instruct.Q4_1.gguf gguf.part` (halves in p0/ and p1/) and GSM8K's
# train.jsonl/test.jsonl in data/ (4.9 MB, or gzipped .jsonl.gz, 1.9 MB); .whl/ and .whl-rg/ (reasoning-gym,
# ~11 MB): bench/make_wheels.sh.
# A call carries 64 MiB with the working tree (~2.7 MB): p1 (49 MB) + .whl (~11 MB) leave room for
# GSM8K only gzipped, so carry .carry/data in a later call (the machine keeps /tmp ~30 s between calls). Outputs go to $OUT (at most 8 files
# come back per call: each of parity, staleness and sft-gsm8k writes 3, gsm8k-eval 2).
# Long phases end their work ONEGPU_LIMIT_S (default 585) seconds after the call began, inside the device
# call's 600 s, so their tables are written whatever was reached.
# On the CPU (every phase's command lines, tiny model, a few rows and steps, nothing timed; ONEGPU_MODEL=DIR
# for another model folder):
#   ONEGPU_CPU=1 PYTHON=/work/main/.venv/bin/python bash bench/onegpu_session.sh setup "parity 2 2 1" ...
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-bench-out}
cpu=${ONEGPU_CPU:-0}
py=${PYTHON:-python3}
limit=${ONEGPU_LIMIT_S:-$([ "$cpu" = 1 ] && echo 3600 || echo 585)}
work=${ONEGPU_WORK:-${RLFLEET_ONEGPU_WORK:-/tmp/rlfleet-onegpu}}
mkdir -p "$out" "$work"
out=$(cd "$out" && pwd)
model=$work/models/smollm2-135m
shrink=()   # on the CPU: the tiny model, a few samples of a few tokens
trl_micro=()
if [ "$cpu" = 1 ]; then
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TQDM_DISABLE=1
  model=${ONEGPU_MODEL:-$("$py" -c "from rlfleet.models.tiny import ensure_tiny_model; print(ensure_tiny_model())")}
  shrink=(rollout.device=cpu learner.device=cpu reward.device=cpu rollout.n=2 rollout.max_new_tokens=8
          controller.prompts_per_step=2 learner.lr_warmup_steps=1)
  trl_micro=(--micro-batch 4)
else
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl >/dev/null 2>&1 || echo "wheel install failed (already installed?)"
  if [ -d .whl-rg ]; then  # reasoning-gym's (bench/make_wheels.sh): wheels, and pycosat compiled from source
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl-rg/*.whl >/dev/null 2>&1 || echo "reasoning-gym wheel install failed (already installed?)"
    if ! PYTHONPATH=/tmp/site python3 -c "import pycosat" 2>/dev/null; then
      rm -rf /tmp/pycosat-src && mkdir -p /tmp/pycosat-src && tar xzf .whl-rg/pycosat-*.tar.gz -C /tmp/pycosat-src
      (cd /tmp/pycosat-src/pycosat-* && gcc -shared -fPIC -O2 -w \
        -I"$(python3 -c "import sysconfig; print(sysconfig.get_paths()['include'])")" pycosat.c \
        -o "/tmp/site/pycosat$(python3 -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")") \
        || echo "pycosat did not compile: reasoning-gym will not import"
    fi
  fi
  export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 TQDM_DISABLE=1
fi
job=(--config deploy/configs/gsm8k-smollm2-135m.yaml model.path=$model
     "data.train_files=[$work/data/train.parquet]" "data.val_files=[$work/data/test.parquet]"
     run.output_dir=$work/outputs rollout.max_new_tokens=128 learner.lr=2.0e-5 reward.fn=auto
     learner.checkpoint_every=0 "${shrink[@]}")
# the arithmetic recipe as committed (its settings are the job's above), no checkpoints
ajob=(--config deploy/configs/arithmetic-smollm2-135m.yaml model.path=$model
      "data.train_files=[$work/data/train.parquet]" "data.val_files=[$work/data/test.parquet]"
      run.output_dir=$work/outputs learner.checkpoint_every=0 "${shrink[@]}")
# the GSM8K recipe (256 new tokens, verl's strict rule by reward.fn=auto)
gjob=(--config deploy/configs/gsm8k-smollm2-135m.yaml model.path=$model
      "data.train_files=[$work/data/gsm8k-train.parquet]" "data.val_files=[$work/data/gsm8k-test.parquet]"
      run.output_dir=$work/outputs learner.checkpoint_every=0 "${shrink[@]}")
# several runs on the one GPU: memory shares and memory-only settings (the file says why)
mapfile -t conc < <(grep -v '^[[:space:]]*#' bench/concurrent_runs.args | grep .)
rlfleet() { "$py" -m rlfleet.app.cli "$@"; }
quiet() { grep -v "Warning\|warn(\|UserWarning"; }
left() {  # seconds left before the limit, less a reserve (at least 1)
  local s=$(( limit - SECONDS - ${1:-0} ))
  echo $(( s > 0 ? s : 1 ))
}

gpu_sampler() {  # GPU memory in use, total and per process, every 5 s, until killed
  [ "$cpu" = 1 ] && return 0
  while :; do
    echo "t=$SECONDS $(nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader)"
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
    sleep 5
  done >> "$1" 2>&1
}

rl_run() {  # NAME S N EVERY SEED RAW: one rlfleet run of the arithmetic recipe among several on the GPU
  local name=$1 raw=$6
  rm -rf "$work/outputs/$name"
  timeout -k 20 "$(left 40)" "$py" -m rlfleet.app.cli run "${ajob[@]}" "${conc[@]}" run.name="$name" run.seed="$5" \
    controller.max_staleness="$2" controller.max_steps="$3" controller.eval_every="$4" \
    controller.eval_before_train=true > "$raw/$name.log" 2>&1
  local rc=$?
  cp "$work/outputs/$name/metrics.jsonl" "$raw/metrics-$name.jsonl" 2>/dev/null
  mkdir -p "$raw/$name-logs" && cp "$work/outputs/$name/logs/"* "$raw/$name-logs/" 2>/dev/null
  echo "$name: rc=$rc, $(grep -o '[0-9]* training prompts from [^ ]*' "$raw/$name.log" | head -1)," \
    "$(grep -c '"val/accuracy"' "$raw/metrics-$name.jsonl" 2>/dev/null) evaluations," \
    "$(grep -c '"actor/pg_loss"' "$raw/metrics-$name.jsonl" 2>/dev/null) steps"
  [ $rc = 0 ] || tail -5 "$raw/$name.log" | quiet
}

trl_eval() {  # FOLDER STEP SEED RAW: `rlfleet eval` of a TRL checkpoint
  OMP_NUM_THREADS=2 timeout -k 20 "$(left 25)" "$py" -m rlfleet.app.cli eval "${ajob[@]}" --model "$1" \
    --output "$4/eval-trl-seed$3-step$2.json" > "$4/eval-trl-seed$3-step$2.log" 2>&1 \
    || { echo "eval of $1 failed:"; tail -3 "$4/eval-trl-seed$3-step$2.log"; }
}

trl_arm() {  # N EVERY SEED RAW: TRL on the same job, each saved step evaluated as soon as it is written
  local n=$1 every=$2 seed=$3 raw=$4 d=$work/trl/seed$3 f
  rm -rf "$d"
  OMP_NUM_THREADS=4 timeout -k 20 "$(left 45)" "$py" bench/gsm8k_trl.py "${ajob[@]}" run.seed="$seed" --out "$d" \
    --max-steps "$n" --save-steps "$(seq -s, "$every" "$every" "$n")" --wall-s "$(left 100)" "${trl_micro[@]}" \
    > "$raw/trl-seed$seed.log" 2>&1 &
  local pid=$!
  local done_=0
  while [ $done_ = 0 ]; do
    kill -0 "$pid" 2>/dev/null || done_=1  # once more after it ended: the last step's folder
    for f in "$d"/step_*; do
      if [ -d "$f" ] && [ ! -e "$f/.evaluating" ]; then
        touch "$f/.evaluating"
        trl_eval "$f" "${f##*_}" "$seed" "$raw" &
      fi
    done
    [ $done_ = 1 ] || sleep 2
  done
  wait "$pid"; local rc=$?
  wait
  cp "$d/trl_steps.jsonl" "$raw/trl_steps-trl-seed$seed.jsonl" 2>/dev/null
  echo "trl-seed$seed: rc=$rc, $(grep -c . "$d/trl_steps.jsonl" 2>/dev/null) steps, evaluated" \
    "$(cd "$d" 2>/dev/null && ls -d step_* | tr '\n' ' ')"
  [ $rc = 0 ] || tail -5 "$raw/trl-seed$seed.log" | quiet
}

concurrent() {  # NAME RUNS OTHERS_GIB: checks the shares of RUNS runs beside OTHERS_GIB, starts the sampler
  local model_dir=()
  [ "$cpu" = 1 ] || model_dir=(--model-dir "$model")
  "$py" bench/concurrent_plan.py --config deploy/configs/arithmetic-smollm2-135m.yaml "${model_dir[@]}" \
    --runs "$2" --others-gib "$3" "${conc[@]}" || return 1
  raw=$work/$1-raw
  rm -rf "$raw" && mkdir -p "$raw"
  gpu_sampler "$raw/gpu_memory.txt" &
  sampler=$!
}

pack() {  # NAME [EXTRA INPUTS...]: the table to $OUT/NAME.{md,json}, the raw results to NAME-raw.tgz
  kill "$sampler" 2>/dev/null
  "$py" bench/parity_table.py "$raw" "${@:2}" --out "$out/$1"
  tar czf "$out/$1-raw.tgz" -C "$work" "$1-raw"
}

gsm8k_data() {  # the GSM8K Parquet files, from .carry/data (on the CPU: the test suite's few rows)
  local src=.carry/data f
  [ "$cpu" = 1 ] && src=${ONEGPU_GSM8K:-tests/assets/gsm8k}
  [ -f "$work/data/gsm8k-test.parquet" ] && return 0
  for f in train test; do  # gzipped (1.9 MB instead of 4.9) where the carry is tight
    [ -f "$src/$f.jsonl.gz" ] && mkdir -p "$work/gsm8k-jsonl" && gunzip -c "$src/$f.jsonl.gz" > "$work/gsm8k-jsonl/$f.jsonl"
  done
  [ -f "$work/gsm8k-jsonl/test.jsonl" ] && src=$work/gsm8k-jsonl
  [ -f "$src/test.jsonl" ] || { echo "no GSM8K: carry .carry/data/{train,test}.jsonl[.gz]"; return 1; }
  rlfleet data gsm8k --input "$src/train.jsonl" --output "$work/data/gsm8k-train.parquet" | tail -1
  rlfleet data gsm8k --input "$src/test.jsonl" --output "$work/data/gsm8k-test.parquet" --split test | tail -1
}

gsm8k_base() {  # the base model on GSM8K test, its samples kept for re-scoring
  [ -f "$work/gsm8k/base.samples.jsonl" ] && return 0
  mkdir -p "$work/gsm8k"
  timeout -k 20 "$(left 25)" "$py" -m rlfleet.app.cli eval "${gjob[@]}" --output "$work/gsm8k/base.json" 2>&1 | quiet \
    | tail -3
}

# calculator N [key=value ...]: see the header. The hard task, traces and the SFT are written here; the
# base model's two evaluations run beside the SFT, the SFT model's beside the GRPO run, the trained
# model's two side by side; each command's timeout leaves the later ones their time (left).
calculator() {
  local n=$1 t d=$work/calc-raw sft=$work/calc-sft name=calc-grpo
  shift
  local level=hard train_rows=20000 test_rows=500 traces=4000 sft_steps=(--epochs 2 --batch-size 32) small=()
  if [ "$cpu" = 1 ]; then
    train_rows=32 test_rows=4 traces=16 sft_steps=(--max-steps 2 --batch-size 1)
    # the tiny model's 256-token context holds no tools' system message, '####' instruction nor hard trace
    [ -n "${ONEGPU_MODEL:-}" ] || { small=(--instruction ""); level=easy; }
  fi
  local tiny_env=()
  [ ${#small[@]} -gt 0 ] && tiny_env=(env.tools_in_prompt=false)
  local calc=(--config deploy/configs/calculator-hard-smollm2-135m.yaml "model.path=$model"
              "data.train_files=[$work/data/hard-train.parquet]" "data.val_files=[$work/data/hard-test.parquet]"
              "run.output_dir=$work/outputs" "${shrink[@]}" "${tiny_env[@]}" "$@")
  local no_tool=(env.name=null "rollout.stop=[]")  # the same prompts without the tools, single turn
  evaluate() {  # MODEL REPORT RESERVE_S [key=value ...]
    local t0=$SECONDS
    timeout -k 10 "$(left "$3")" "$py" -m rlfleet.app.cli eval "${calc[@]}" --model "$1" --output "$d/$2" \
      "${@:4}" > "$d/${2%.json}.log" 2>&1 || { echo "eval $2 failed:"; tail -3 "$d/${2%.json}.log"; }
    echo "--- eval $2: $((SECONDS - t0)) s"
  }
  rm -rf "$d" "$sft" "$work/outputs/$name" && mkdir -p "$d"
  t=$SECONDS
  rlfleet data arithmetic --level $level --output "$work/data/hard-train.parquet" --rows $train_rows \
    "${small[@]}" 2>&1 | tail -1
  rlfleet data arithmetic --level $level --output "$work/data/hard-test.parquet" --rows $test_rows --split test \
    "${small[@]}" 2>&1 | tail -1
  local tools_flag=()
  [ ${#small[@]} -gt 0 ] && tools_flag=(--tools-in-prompt false)
  rlfleet data traces --env calculator --task arithmetic --level $level --rows $traces --seed 1 \
    --output "$work/data/hard-traces.parquet" "${small[@]}" "${tools_flag[@]}" 2>&1 | grep "^rlfleet"
  echo "--- data: $((SECONDS - t)) s"
  { evaluate "$model" calc-base-notool.json 420 "${no_tool[@]}"; evaluate "$model" calc-base-tool.json 400; } &
  local base_evals=$!
  t=$SECONDS
  timeout -k 10 "$(left 380)" "$py" -m rlfleet.app.cli sft --config deploy/configs/calculator-sft-smollm2-135m.yaml \
    "model.path=$model" "${shrink[@]}" "$@" --data "$work/data/hard-traces.parquet" --output "$sft" \
    "${sft_steps[@]}" > "$d/sft.log" 2>&1
  grep "^rlfleet: sft" "$d/sft.log"; echo "--- sft: $((SECONDS - t)) s"
  cp "$sft/metrics.jsonl" "$d/metrics-calc-sft.jsonl" 2>/dev/null
  [ -f "$sft/model/config.json" ] || { tail -5 "$d/sft.log"; wait; return 1; }
  { evaluate "$sft/model" calc-sft-notool.json 120 "${no_tool[@]}"; evaluate "$sft/model" calc-sft-tool.json 90; } &
  t=$SECONDS
  timeout -k 20 "$(left 90)" "$py" -m rlfleet.app.cli run "${calc[@]}" model.path="$sft/model" run.name=$name \
    controller.max_steps="$n" controller.eval_every=0 controller.eval_before_train=false \
    learner.checkpoint_every=20 controller.samples_per_step=16 > "$d/grpo.log" 2>&1 \
    || { echo "grpo run stopped early:"; tail -4 "$d/grpo.log" | quiet; }
  echo "--- grpo: $((SECONDS - t)) s"
  cp "$work/outputs/$name/metrics.jsonl" "$d/metrics-$name.jsonl" 2>/dev/null
  cp "$work/outputs/$name/samples/train.jsonl" "$d/samples-$name.jsonl" 2>/dev/null
  wait  # the base and SFT evaluations
  evaluate "$work/outputs/$name" calc-grpo-notool.json 15 "${no_tool[@]}" &
  evaluate "$work/outputs/$name" calc-grpo-tool.json 15 &
  wait
  "$py" bench/calculator_table.py --arm "base, no tool=$d/calc-base-notool.json" \
    --arm "base, with tool=$d/calc-base-tool.json" --arm "sft, no tool=$d/calc-sft-notool.json" \
    --arm "sft, with tool=$d/calc-sft-tool.json" --arm "sft+grpo, no tool=$d/calc-grpo-notool.json" \
    --arm "sft+grpo, with tool=$d/calc-grpo-tool.json" --sft-metrics "$d/metrics-calc-sft.jsonl" \
    --grpo-metrics "$d/metrics-$name.jsonl" --out "$out/calculator-summary.json" | tee "$out/calculator-table.txt"
  tar czf "$out/calc-raw.tgz" -C "$work" calc-raw  # reports, samples, logs, metrics
}

# reasoning-gym N TASK [key=value ...]: see the header. The data need the wheels of bench/make_wheels.sh
# (reasoning-gym and its pure-python dependencies) on the GPU machine.
rg_job() {  # DATA_DIR MODEL: rgj=(the reasoning-gym recipe's job on the files in DATA_DIR and MODEL)
  rgj=(--config deploy/configs/reasoning-gym-smollm2-135m.yaml model.path="$2"
       "data.train_files=[$1/train.parquet]" "data.val_files=[$1/test.parquet]" run.output_dir="$work/outputs"
       "${shrink[@]}")
}

rg_model() {  # NAME: rgm=(the model's path, the files' tag): setup's SmolLM2 for "", else $work/models/NAME
  # (qwen-setup imports it there); on the CPU always the tiny model, the tag kept
  if [ -z "$1" ]; then rgm=("$model" ""); return; fi
  if [ "$cpu" = 1 ]; then rgm=("$model" "$1-"); return; fi
  [ -f "$work/models/$1/config.json" ] || { echo "no model $work/models/$1 (qwen-setup $1 first)"; return 1; }
  rgm=("$work/models/$1" "$1-")
}

rg_importable() {  # says which module is missing when reasoning-gym cannot be imported here
  local err
  if ! err=$("$py" -c "import reasoning_gym" 2>&1); then
    echo "reasoning-gym does not import ($(echo "$err" | tail -1)): carry .whl-rg (bench/make_wheels.sh)"
    return 1
  fi
}

reasoning_gym_base() {  # TASKS [ROWS] [model=NAME]
  rg_importable || return 1
  local tasks=$1 rows="" d=$work/data/rg-base name=""
  shift
  case "${1:-}" in model=*|"") ;; *) rows=$1; shift ;; esac
  case "${1:-}" in model=*) name=${1#model=} ;; esac
  [ -n "$rows" ] || { rows=200; [ "$cpu" = 1 ] && rows=4; }
  rg_model "$name" || return 1
  rm -rf "$d" && mkdir -p "$d"
  local count=$(( rows * $(echo "$tasks" | tr ',' '\n' | grep -c .) ))
  rlfleet data reasoning-gym "$tasks" --rows "$count" --split test --output "$d/test.parquet" 2>&1 | tail -1
  cp "$d/test.parquet" "$d/train.parquet"  # the job names a train file; eval reads only the test one
  rg_job "$d" "${rgm[0]}"
  # the table has each task's majority-answer baseline and answer diversity beside its accuracy
  local report=$out/rg-base${rgm[1]:+-${rgm[1]%-}}.json
  timeout -k 20 "$(left 20)" "$py" -m rlfleet.app.cli eval "${rgj[@]}" --output "$report" 2>&1 \
    | quiet | grep -v "^rlfleet: report\|^Loading"
}

reasoning_gym() {  # N TASK|auto [sft=STEPS] [model=NAME] [key=value ...]
  rg_importable || return 1
  local n=$1 task=$2 name rows=20000 test_rows=500 d t sft_steps=0 start mname="" base_model tag
  shift 2
  case "${1:-}" in sft=*) sft_steps=${1#sft=}; shift ;; esac
  case "${1:-}" in model=*) mname=${1#model=}; shift ;; esac
  rg_model "$mname" || return 1
  base_model=${rgm[0]} tag=${rgm[1]} start=${rgm[0]}
  if [ "$task" = auto ]; then  # the task 5-30 points over its majority-answer baseline, from this call's base table
    local report=$out/rg-base${tag:+-${tag%-}}.json
    task=$("$py" bench/rg_pick_task.py "$report") || return 1
    echo "--- task: $task (bench/rg_pick_task.py on $(basename "$report"): accuracy over the baseline)"
  fi
  name=rg-$tag$task-$n d=$work/data/rg-$task
  [ "$cpu" = 1 ] && rows=64 test_rows=8
  t=$SECONDS
  rlfleet data reasoning-gym "$task" --rows $rows --output "$d/train.parquet" 2>&1 | tail -1
  rlfleet data reasoning-gym "$task" --rows $test_rows --split test --output "$d/test.parquet" 2>&1 | tail -1
  echo "--- data: $((SECONDS - t)) s"
  rg_job "$d" "$base_model"
  evaluate_rg() {  # MODEL REPORT [key=value ...]
    t=$SECONDS
    timeout -k 10 120 "$py" -m rlfleet.app.cli eval "${rgj[@]}" "${@:3}" --model "$1" --output "$out/$2" 2>&1 \
      | quiet | grep -v "^rlfleet: report\|^Loading" | tail -5  # the row, with baseline/distinct/top, and notes
    echo "--- eval $2: $((SECONDS - t)) s"
  }
  evaluate_rg "$base_model" "rg-$tag$task-base.json" "$@"
  if [ "$sft_steps" -gt 0 ]; then  # the format warm start: the train rows' extra_info.answer (<answer>X</answer>)
    t=$SECONDS
    rm -rf "$work/rg-sft"
    timeout -k 10 "$(left 200)" "$py" -m rlfleet.app.cli sft "${rgj[@]}" "$@" "data.val_files=[]" --data "$d/train.parquet" \
      --output "$work/rg-sft" --max-steps "$sft_steps" --batch-size 32 > "$work/rg-sft.log" 2>&1
    grep "^rlfleet: sft model" "$work/rg-sft.log"; echo "--- sft: $((SECONDS - t)) s"
    [ -f "$work/rg-sft/model/config.json" ] || { echo "the warm start wrote no model:"; tail -5 "$work/rg-sft.log"; return 1; }
    cp "$work/rg-sft/metrics.jsonl" "$out/metrics-rg-$tag$task-sft.jsonl"
    start=$work/rg-sft/model
    evaluate_rg "$start" "rg-$tag$task-sft.json" "$@"
  fi
  t=$SECONDS
  rm -rf "$work/outputs/$name"
  timeout -k 20 "$(left 100)" "$py" -m rlfleet.app.cli run "${rgj[@]}" model.path="$start" run.name="$name" \
    controller.max_steps="$n" controller.eval_every=20 controller.eval_before_train=false "$@" 2>&1 \
    | quiet | grep -v '"event": "step"' | tail -6
  echo "--- run: $((SECONDS - t)) s"
  cp "$work/outputs/$name/metrics.jsonl" "$out/metrics-$name.jsonl"
  "$py" bench/step_times.py "$out/metrics-$name.jsonl"
  evaluate_rg "$work/outputs/$name" "rg-$tag$task-trained.json" "$@"
}

# the GSM8K recipe of a real Qwen model (docs/recipes/gsm8k-qwen2.5-coder.md), its files under $work
qjob() {  # NAME: qj=(the recipe's job on setup's model and data)
  local path=$work/models/$1 extra=()
  [ "$cpu" = 1 ] && { path=$model; extra=(data.max_prompt_length=160 controller.max_steps=2 controller.eval_every=1); }
  qj=(--config "deploy/configs/gsm8k-$1.yaml" model.path="$path" run.output_dir="$work/outputs"
      "data.train_files=[$work/data/gsm8k-train.parquet]" "data.val_files=[$work/data/gsm8k-test.parquet]"
      "${shrink[@]}" "${extra[@]}")
}

qwen_setup() {  # NAME
  if [ "$cpu" != 1 ]; then
    "$py" bench/model_parts.py check "$work/model.gguf" "$1" || return 1
    rlfleet model import "$work/model.gguf" --output "$work/models/$1" --force 2>&1 | quiet | tail -2
  fi
  gsm8k_data
}

qwen_eval() {  # NAME: the base model under the three rules
  local d=$work/qwen-eval-$1
  rm -rf "$d" && mkdir -p "$d"
  qjob "$1"
  timeout -k 20 "$(left 30)" "$py" -m rlfleet.app.cli eval "${qj[@]}" --output "$d/base.json" 2>&1 | quiet | tail -4
  "$py" bench/rescore_samples.py "base=$d/base.samples.jsonl" --fn gsm8k --fn gsm8k_flexible --fn gsm8k_lenient \
    --out "$out/qwen-eval-${1//./}"
}

qwen_run() {  # NAME RUN [key=value ...]: in its own session, so it outlives this call
  local name=$1 run=$2
  shift 2
  qjob "$name"
  rm -rf "$work/outputs/$run" "$work/$run-prof"
  RLFLEET_PROFILE_DIR=$work/$run-prof setsid nohup "$py" -m rlfleet.app.cli run "${qj[@]}" run.name="$run" "$@" \
    > "$work/$run.log" 2>&1 < /dev/null &
  echo "$!" > "$work/$run.pid"
  echo "started $run (pid $!): $work/$run.log"
}

qwen_wait() {  # RUN SECONDS
  local run=$1 until=$((SECONDS + $2)) pid d=$work/outputs/$1
  pid=$(cat "$work/$run.pid" 2>/dev/null) || { echo "no run $run here (a cold machine lost /tmp)"; return 1; }
  while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $until ] && [ "$(left 20)" -gt 1 ]; do sleep 5; done
  kill -0 "$pid" 2>/dev/null && echo "$run still running" || echo "$run ended: $(tail -2 "$work/$run.log" | quiet)"
  grep -h "memory plan\|micro-batch chosen" "$d/logs/"*.log 2>/dev/null | head -3 | cut -c1-300
  cp "$d/metrics.jsonl" "$out/metrics-$run.jsonl" 2>/dev/null || { tail -20 "$work/$run.log"; return 1; }
  "$py" -c "import json,sys
for l in open(sys.argv[1]):
    m = json.loads(l)
    if any(k.startswith('val/') and k.endswith('accuracy') for k in m) or m.get('step', 0) % 10 == 0:
        print({k: round(v, 4) if isinstance(v, float) else v for k, v in m.items() if k in ('step', 'reward/mean',
               'val/accuracy', 'timing/step_s', 'response_length/mean', 'response_length/clip_ratio', 'actor/entropy',
               'mismatch/kl', 'mismatch/abs_logprob_diff_max', 'mismatch/ratio_over_2', 'timing/gen_s',
               'timing/learner_step_s', 'perf/learner_mfu')})" "$d/metrics.jsonl" | tail -30
  "$py" bench/step_times.py "$d/metrics.jsonl" --first 6
  tar czf "$out/$run-val.tgz" -C "$work" "outputs/$run/samples/val.jsonl" "outputs/$run/logs" "$run.log" \
    $(cd "$work" && ls -d "$run-prof" 2>/dev/null) 2>/dev/null
}

unpack_src() {  # TGZ: a carried `git archive`, unpacked once under $work; prints where
  local code=$work/src-$(basename "$1" .tgz)
  [ -d "$code" ] || { mkdir -p "$code" && tar xzf "$1" -C "$code"; } || return 1
  echo "$code"
}

fleet_sim() {  # TAG [src=TGZ] ARGS...: one bench/fleet_sim.py run in the background
  local tag=$1 code=$PWD
  shift
  if [ "${1:-}" != "${1#src=}" ]; then
    code=$(unpack_src "${1#src=}") || return 1
    shift
  fi
  # the simulator's children get PYTHONPATH=<its tree> alone: the carried wheels go on every path by a .pth
  [ "$cpu" = 1 ] || echo /tmp/site > "$(python3 -c 'import site; print(site.getsitepackages()[0])')/rlfleet-site.pth"
  mkdir -p "$work/fleet"
  (cd "$code" && setsid "$py" bench/fleet_sim.py "$@" --out "$work/fleet/$tag" > "$work/fleet/$tag.log" 2>&1 &
   echo $! > "$work/fleet/$tag.pid")
  echo "$tag: started from $code"
  [ "$cpu" = 1 ] || sleep 8  # runs started at once raced for the same free ports (a controller exited 2)
}

fleet_wait() {  # SECONDS: the started simulator runs, each result as $OUT/fleet-TAG.json
  local until=$((SECONDS + $1)) f tag running=1
  while [ $running = 1 ] && [ $SECONDS -lt $until ] && [ "$(left 15)" -gt 1 ]; do
    running=0
    for f in "$work"/fleet/*.pid; do kill -0 "$(cat "$f")" 2>/dev/null && running=1; done
    [ $running = 0 ] || sleep 5
  done
  for f in "$work"/fleet/*.pid; do
    tag=$(basename "$f" .pid)
    if kill -0 "$(cat "$f")" 2>/dev/null; then echo "$tag: still running"; continue; fi
    local result
    result=$(ls "$work/fleet/$tag"/*/result.json 2>/dev/null | head -1)
    if [ -n "$result" ]; then  # analysed again by this tree's bench/fleetsim/measure.py (a src= run's is older)
      "$py" -m bench.fleetsim.measure "$(dirname "$result")" > /dev/null || echo "$tag: not analysed again"
      cp "$result" "$out/fleet-$tag.json"
      "$py" -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[2], {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items() if k in ('fraction_of_ideal', 'fraction_of_ideal_outside_pause', 'groups_per_s', 'ideal_groups_per_s', 'controller_cpu_ms_per_group', 'admission_ms_p99', 'admission_ms_p99_outside_pause', 'train_call_beyond_modelled_s_p50', 'reform_s_max', 'requeued', 'lost', 'invariant_errors', 'slowdown', 'commit')})" "$result" "$tag"
    else
      echo "$tag: no result"; tail -5 "$work/fleet/$tag.log"
    fi
    mv "$f" "$f.done"
  done
}

phase() {
  local t0=$SECONDS k
  echo "=== $* ($(date +%T))"
  case "$1" in
    part0) cp .carry/p0/gguf.part00 "$work/" && ls -la "$work" ;;
    setup)
      local rows=20000 test_rows=500
      if [ "$cpu" = 1 ]; then rows=64 test_rows=8; else
        cat "$work/gguf.part00" .carry/p1/gguf.part01 > "$work/smol.gguf" || return 1
        rlfleet model import "$work/smol.gguf" --output "$model" --force 2>&1 | quiet | tail -2
      fi
      rlfleet data arithmetic --output "$work/data/train.parquet" --rows $rows 2>&1 | tail -1
      rlfleet data arithmetic --output "$work/data/test.parquet" --rows $test_rows --split test 2>&1 | tail -1
      [ -d .carry/data ] || [ "$cpu" = 1 ] && gsm8k_data ;;
    tests) timeout "$(left 60)" "$py" -m pytest -q -m gpu tests/gpu/test_weight_ipc.py tests/gpu/test_fast_rollout.py \
             tests/gpu/test_fused_kernels.py tests/gpu/test_learner_memory_metrics.py \
             tests/gpu/test_learner_compile_gpu.py tests/gpu/test_pull_during_capture.py -p no:cacheprovider \
             2>&1 | tail -8 ;;
    profile) timeout 420 "$py" bench/onegpu_profile.py --model "$model" \
               --data "$work/data/train.parquet" --out "$out/onegpu_profile.json" 2>&1 | quiet | grep -v "^Loading" ;;
    learner-gap)
      for cap in 0 0.6; do
        timeout 300 "$py" bench/onegpu_profile.py --model "$model" --data "$work/data/train.parquet" \
          --decode-arms compiled --variants both/none --fresh-batches --generations 6 --train-steps 6 \
          --memory-fraction "$cap" --out "$out/learner_gap_cap$cap.json" 2>&1 | quiet | grep -v "^Loading"
      done ;;
    weights) timeout 300 python3 bench/weight_sync.py --device onegpu --shapes 135m,0.5b --reps 10 \
               --out "$out/weight_sync_onegpu.json" 2>&1 | quiet ;;
    run)  # run S N E [src=TGZ] [key=value ...]: src= runs a carried `git archive`'s code (the before of a change)
      local name="s$2-$3-$4" code=$PWD
      local extra=("${@:5}")
      if [[ "${5:-}" == src=* ]]; then
        code=$(unpack_src "${5#src=}") || return 1
        name=$name-$(basename "${5#src=}" .tgz)
        extra=("${@:6}")
      fi
      (cd "$code" && PYTHONPATH=$code${PYTHONPATH:+:$PYTHONPATH} timeout 420 "$py" -m rlfleet.app.cli run \
        "${job[@]}" run.name=$name controller.max_staleness="$2" controller.max_steps="$3" \
        controller.eval_every="$4" "controller.eval_before_train=$([ "$4" = 0 ] && echo false || echo true)" \
        "${extra[@]}") 2>&1 | quiet | grep -v '"event": "step"' | tail -12
      cp "$work/outputs/$name/metrics.jsonl" "$out/metrics-$name.jsonl"
      "$py" bench/step_times.py "$out/metrics-$name.jsonl"
      grep -h "transport\|memory plan" "$work/outputs/$name/logs/"*.log | head -4 ;;
    inservice)  # inservice S N STEPS: the run phase's job traced at STEPS (rlfleet/profiling.py)
      local name="prof-s$2" d=$work/prof-s$2
      rm -rf "$d" "$work/outputs/$name"
      RLFLEET_PROFILE_STEPS=$4 RLFLEET_PROFILE_DIR=$d timeout 300 "$py" -m rlfleet.app.cli run "${job[@]}" \
        run.name=$name controller.max_staleness="$2" controller.max_steps="$3" controller.eval_every=0 \
        controller.eval_before_train=false "${@:5}" 2>&1 | quiet | grep -v '"event": "step"' | tail -4
      cp "$work/outputs/$name/metrics.jsonl" "$d/metrics-$name.jsonl" 2>/dev/null
      "$py" bench/step_times.py "$d/metrics-$name.jsonl" --first 3
      for k in "$d"/*.txt; do [ -f "$k" ] && head -32 "$k" | cut -c1-150; done
      tar czf "$out/inservice-s$2.tgz" -C "$work" "prof-s$2" ;;
    trl)  # trl N [fast] [noeval], the flags in any order: the arm is trl or trl-fast, noeval names no arm
      local arm=trl fast=() noeval=0 flag
      for flag in "${@:3}"; do
        case $flag in
          fast) arm=trl-fast; fast=(--fast) ;;
          noeval) noeval=1 ;;
          *) echo "trl: unknown flag $flag (fast, noeval)"; return 1 ;;
        esac
      done
      if [ "$noeval" = 1 ]; then echo "trl: arm $arm, no evaluation (noeval)"; else echo "trl: arm $arm, then rlfleet eval"; fi
      rm -rf "$work/$arm"
      timeout "$(left 30)" "$py" bench/gsm8k_trl.py "${job[@]}" --out "$work/$arm" --max-steps "$2" "${trl_micro[@]}" \
        "${fast[@]}" 2>&1 | quiet | tail -4
      cp "$work/$arm/trl_steps.jsonl" "$out/${arm}_steps.jsonl"
      "$py" -c "import json,statistics,sys; t=[json.loads(l)['t'] for l in open(sys.argv[1])]; d=[b-a for a,b in zip(t,t[1:])][4:]; print(sys.argv[2], len(t), 'steps, median s/step after step 5:', round(statistics.median(d),3) if d else '-')" "$out/${arm}_steps.jsonl" "$arm"
      [ "$noeval" = 1 ] || rlfleet eval "${job[@]}" --model "$work/$arm/model" --output "$out/${arm}_eval.json" 2>&1 \
        | quiet | tail -4 ;;
    calculator) calculator "${@:2}" ;;
    parity)  # parity N SEEDS [EVERY]: S=0 and TRL, SEEDS each, all at once
      local n=$2 seeds=$3 every=${4:-20}
      # beside the runs: TRL ~16 GiB each (micro-batch 64 x ~230 tokens, no checkpointing), 3 evaluations ~4
      concurrent parity "$seeds" $((16 * seeds + 12)) || return 1
      OMP_NUM_THREADS=2 timeout -k 20 "$(left 25)" "$py" -m rlfleet.app.cli eval "${ajob[@]}" \
        --output "$raw/eval-base.json" > "$raw/eval-base.log" 2>&1 &
      for k in $(seq 1 "$seeds"); do
        rl_run "rlfleet-S0-seed$k" 0 "$n" "$every" "$k" "$raw" &
        trl_arm "$n" "$every" "$k" "$raw" &
      done
      wait_all
      pack parity ;;
    staleness)  # staleness N SEEDS [EVERY]: S=1 and S=2, SEEDS each, all at once
      local n=$2 seeds=$3 every=${4:-20} earlier=()
      concurrent staleness $((2 * seeds)) 0 || return 1
      for k in $(seq 1 "$seeds"); do
        rl_run "rlfleet-S1-seed$k" 1 "$n" "$every" "$k" "$raw" &
        rl_run "rlfleet-S2-seed$k" 2 "$n" "$every" "$k" "$raw" &
      done
      wait_all
      [ -d "$work/parity-raw" ] && earlier=("$work/parity-raw")  # an earlier call's parity phase: one table
      pack staleness "${earlier[@]}" ;;
    gsm8k-eval)
      gsm8k_data || return 1
      gsm8k_base
      "$py" bench/rescore_samples.py "base=$work/gsm8k/base.samples.jsonl" --fn gsm8k --fn gsm8k_flexible \
        --fn gsm8k_lenient --out "$out/gsm8k-eval" ;;
    sft-gsm8k)  # sft-gsm8k N [EPOCHS]
      local n=$2 epochs=${3:-1} d=$work/sft-gsm8k-raw
      gsm8k_data || return 1
      rm -rf "$d" && mkdir -p "$d"
      gsm8k_base > "$d/base-eval.log" 2>&1 &  # beside the SFT, unless the gsm8k-eval phase did it
      timeout -k 20 "$(left 150)" "$py" -m rlfleet.app.cli sft "${gjob[@]}" learner.lr=2.0e-5 "data.val_files=[]" \
        --data "$work/data/gsm8k-train.parquet" --output "$work/sft" --epochs "$epochs" --batch-size 32 \
        > "$d/sft.log" 2>&1
      grep "rlfleet: sft" "$d/sft.log"; cp "$work/sft/metrics.jsonl" "$d/sft-metrics.jsonl" 2>/dev/null
      [ -f "$work/sft/model/config.json" ] || { tail -5 "$d/sft.log"; return 1; }
      OMP_NUM_THREADS=2 timeout -k 20 "$(left 25)" "$py" -m rlfleet.app.cli eval "${gjob[@]}" --model "$work/sft/model" \
        --output "$d/sft-eval.json" > "$d/sft-eval.log" 2>&1 &  # beside the GRPO run
      rm -rf "$work/outputs/sft-grpo"
      timeout -k 20 "$(left 30)" "$py" -m rlfleet.app.cli run "${gjob[@]}" model.path="$work/sft/model" run.name=sft-grpo \
        controller.max_steps="$n" controller.eval_every="$n" controller.eval_before_train=false > "$d/grpo.log" 2>&1 \
        || tail -5 "$d/grpo.log"
      wait
      cp "$work/outputs/sft-grpo/metrics.jsonl" "$d/grpo-metrics.jsonl" 2>/dev/null
      local inputs=()
      [ -f "$work/gsm8k/base.samples.jsonl" ] && inputs+=("base=$work/gsm8k/base.samples.jsonl")
      [ -f "$d/sft-eval.samples.jsonl" ] && inputs+=("sft-${epochs}ep=$d/sft-eval.samples.jsonl")
      grep -q "\"step\": $n," "$work/outputs/sft-grpo/samples/val.jsonl" 2>/dev/null \
        && inputs+=("sft-grpo-${n}=$work/outputs/sft-grpo/samples/val.jsonl@$n")
      "$py" bench/rescore_samples.py "${inputs[@]}" --fn gsm8k --fn gsm8k_flexible --fn gsm8k_lenient \
        --out "$out/sft-gsm8k"
      tar czf "$out/sft-gsm8k-raw.tgz" -C "$work" sft-gsm8k-raw ;;
    reasoning-gym-base) reasoning_gym_base "${@:2}" ;;
    reasoning-gym) reasoning_gym "${@:2}" ;;
    chunk) shift; cat "$@" >> "$work/model.gguf" && echo "$work/model.gguf: $(stat -c %s "$work/model.gguf") bytes" ;;
    qwen-setup) qwen_setup "$2" ;;
    qwen-eval) qwen_eval "$2" ;;
    qwen-run) qwen_run "${@:2}" ;;
    qwen-wait) qwen_wait "$2" "$3" ;;
    fleet-sim) fleet_sim "${@:2}" ;;
    fleet-wait) fleet_wait "$2" ;;
    bench) shift; timeout 300 python3 "$@" 2>&1 | quiet | tail -15 ;;
    *) echo "unknown phase $1" ;;
  esac
  echo "=== $1 took $((SECONDS - t0)) s"
}

wait_all() {  # every background job but the GPU sampler
  local pid
  for pid in $(jobs -p); do [ "$pid" = "${sampler:-}" ] || wait "$pid"; done
}

for p in "$@"; do
  # shellcheck disable=SC2086
  phase $p
done
