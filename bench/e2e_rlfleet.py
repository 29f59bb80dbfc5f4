"""One rlfleet arm of bench/e2e_grpo.py: `python -m rlfleet.app.cli run ...` as a child process.

Steps are read from the run's own metrics.jsonl while it runs: each line is stamped when it
appears (polled every 20 ms), and its samples and generated tokens come from the line itself
(`perf/samples_per_s` x `timing/step_s`, `response_length/mean`).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.e2e_common import ArmResult, JsonlFollower, StepRecord


def overrides(args, *, name: str, staleness: int, model_dir: Path, parquet: Path,
              micro_batch_tokens: int) -> list[str]:
    if args.device == "cuda":
        rollout_dev, learner_dev = f"cuda:{args.rollout_gpu}", f"cuda:{args.learner_gpu}"
    else:
        rollout_dev = learner_dev = "cpu"
    per_request = args.prompts_per_request or args.prompts_per_step
    return [
        f"run.name={name}", f"run.output_dir={args.work_dir}/runs", f"run.seed={args.seed}",
        "run.max_restarts=0",
        f"model.path={model_dir}", "model.dtype=auto",  # bf16 on CUDA, float32 on CPU
        f"data.train_files=[{parquet}]", "data.shuffle=false",
        f"rollout.device={rollout_dev}", "rollout.backend=hf", f"rollout.n={args.n}",
        f"rollout.max_new_tokens={args.max_new_tokens}", "rollout.temperature=1.0", "rollout.top_p=1.0",
        "rollout.top_k=0", f"rollout.max_batch_sequences={max(256, per_request * args.n)}",
        f"learner.device={learner_dev}", f"learner.lr={args.lr}",
        f"learner.micro_batch_tokens={micro_batch_tokens}",
        "learner.betas=[0.9,0.99]", "learner.grad_clip=1.0", "learner.weight_decay=0.0",
        f"controller.max_steps={args.warmup_steps + args.steps}",
        f"controller.prompts_per_step={args.prompts_per_step}",
        f"controller.prompts_per_request={per_request}", f"controller.max_staleness={staleness}",
        "algorithm.name=grpo", "algorithm.kl_coef=0.0",
        *args.rlfleet_override,
    ]


def _record(line: dict, t: float) -> StepRecord:
    step_s = float(line.get("timing/step_s") or 0.0)
    samples = round(float(line.get("perf/samples_per_s") or 0.0) * step_s)
    tokens = round(float(line.get("response_length/mean") or 0.0) * samples)
    keep = {"staleness/mean": "stale", "staleness/dropped_groups": "dropped", "timing/gen_s": "gen_s",
            "timing/wait_s": "wait_s", "timing/train_s": "train_s", "timing/weight_sync_s": "sync_s",
            "timing/step_s": "step_s"}
    extra = {short: line.get(key) for key, short in keep.items()}
    extra["reward"] = float(line.get("reward/mean") or 0.0)
    return StepRecord(int(line["step"]), t, samples, tokens, extra)


def run_arm(args, *, name: str, staleness: int, model_dir: Path, parquet: Path, micro_batch_tokens: int,
            env: dict) -> ArmResult:
    run_dir = Path(args.work_dir) / "runs" / name
    if run_dir.exists():
        import shutil
        shutil.rmtree(run_dir)
    cmd = [sys.executable, "-m", "rlfleet.app.cli", "run",
           *overrides(args, name=name, staleness=staleness, model_dir=model_dir, parquet=parquet,
                      micro_batch_tokens=micro_batch_tokens)]
    log_path = Path(args.work_dir) / f"{name}.log"
    metrics_path = run_dir / "metrics.jsonl"
    steps: list[StepRecord] = []
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        metrics, error = JsonlFollower(metrics_path), ""
        try:
            while True:
                now = time.perf_counter() - t0
                for line in metrics.new_lines():
                    if "timing/step_s" in line:  # not an evaluation-only line
                        steps.append(_record(line, now))
                if proc.poll() is not None:
                    break
                if now > args.arm_timeout_s:
                    error = f"timed out after {args.arm_timeout_s:.0f}s"
                    break
                time.sleep(0.02)
        finally:
            _stop(proc)
    total = time.perf_counter() - t0
    if proc.returncode not in (0, None) and not error:
        error = f"exit {proc.returncode}: " + _tail(log_path)
    return ArmResult(name, steps, total, note=f"max_staleness={staleness}; log {log_path}", error=error)


def _stop(proc: subprocess.Popen) -> None:
    """Ctrl-C to `rlfleet run` (it stops its services), then harder, only to the process group we started."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGINT, 30), (signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(path: Path, n: int = 400) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return " ".join(text[-n:].split())
