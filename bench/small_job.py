"""A small job, rlfleet against TRL: samples/s, time to the first step and memory of every process.

The embedded default's job (the built-in tiny model and digits_reverse task, rlfleet's default
settings) at 32 prompts x 8 samples per step, run by `rlfleet run` synchronous
(`controller.max_staleness=0`), `rlfleet run` asynchronous (the default staleness) and TRL 1.16's
`GRPOTrainer` with the same settings (bench/e2e_trl.py's child: lr, betas, grad clip, no KL,
token-mean loss, clip 0.2, temperature 1, max new tokens), in paired rounds: each round runs the
three arms back to back, so a ratio compares runs made under the same load of a shared machine.

Per arm and round:
- samples/s from the end of step --warmup-steps to the end of the last step (each run's own step
  stamps: rlfleet's metrics.jsonl lines as they appear, a TRL callback), and its ratio to the same
  round's TRL;
- time to the first step: from starting the process (`rlfleet run` / the TRL script) to the end
  of step 1, start-up of every service included;
- memory: the largest RSS summed over the process tree seen (sampled every 0.5 s), with the PSS
  sum at that moment and the per-process split (bench/proc_memory.py);
- CPU time per sample over the measured steps, summed over the process tree: what the work costs
  whatever else the machine runs (wall-clock rates on a shared machine swing with its load).
An arm `trl-1t` runs TRL with one torch thread (see ARMS).

  python bench/small_job.py                               # CPU, built-in model, 3 rounds
  python bench/small_job.py --model PATH --data F.parquet --device cuda --max-new-tokens 256
  python bench/small_job.py --config deploy/configs/gsm8k-smollm2-135m.yaml --device cuda \\
      --arms sync,async,trl

With --config the job's own settings (group size, prompts per step, new tokens, lr, temperature)
are used by every arm unless given here; its periodic evaluation is turned off (throughput only).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.e2e_common import JsonlFollower, subprocess_env  # noqa: E402 - after the sys.path insert above
from bench.e2e_rlfleet import _record, _stop  # noqa: E402
from bench.proc_memory import MemoryPeak, TreeMemory, cpu_seconds  # noqa: E402

# trl-1t: TRL with one torch thread. On a machine shared with other work, a 2-thread OpenMP process
# collapses when the cores are oversubscribed (its threads spin-wait for each other), which rlfleet's
# one-thread-per-role processes do not: trl-1t is the like-for-like arm there.
ARMS = ("sync", "async", "trl", "trl-1t")
BEFORE_ARMS = ("before-sync", "before-async")  # --baseline-repo: rlfleet of another checkout, same rounds


@dataclass
class ArmRun:
    arm: str
    round: int
    steps: list[tuple[int, float, int]] = field(default_factory=list)  # (step, t since start, samples)
    memory: MemoryPeak = field(default_factory=MemoryPeak)
    extra: dict = field(default_factory=dict)  # rlfleet's median timings per step
    cpu_s: float | None = None  # CPU seconds of the whole process tree over the measured steps
    error: str = ""

    def first_step_s(self) -> float | None:
        return next((t for s, t, _ in self.steps if s == 1), None)

    def samples_per_s(self, warmup: int) -> float | None:
        base = [t for s, t, _ in self.steps if s == warmup]
        done = [(t, n) for s, t, n in self.steps if s > warmup]
        if not base or not done:
            return None
        return sum(n for _, n in done) / (done[-1][0] - base[0])

    def cpu_ms_per_sample(self, warmup: int) -> float | None:
        """CPU time per sample over the measured steps: what the work costs, whatever else the
        machine runs (wall-clock rates on a shared machine swing with its load)."""
        done = sum(n for s, _, n in self.steps if s > warmup)
        return 1000 * self.cpu_s / done if self.cpu_s is not None and done else None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default=None, help="an rlfleet job file (e.g. a recipe) for both rlfleet "
                   "arms; "
                   "its settings are the job's")
    p.add_argument("--model", default=None, help="model.path: builtin:tiny (default) or an HF model folder")
    p.add_argument("--data", default=None, help="training Parquet (verl schema); default: the built-in task")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: rollout and learner share GPU 0 (rlfleet's device=auto), TRL runs on it alone")
    p.add_argument("--arms", default=",".join(ARMS), help="comma-separated subset of sync,async,trl")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompts-per-step", type=int, default=None, help="default 32 (with --config: its value)")
    p.add_argument("--n", type=int, default=None, help="samples per prompt (rollout.n / num_generations); "
                   "default 8 (with --config: its value)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="default: rlfleet's default")
    p.add_argument("--lr", type=float, default=None, help="default: rlfleet's learner.lr")
    p.add_argument("--steps", type=int, default=6, help="measured steps")
    p.add_argument("--warmup-steps", type=int, default=2)
    p.add_argument("--micro-batch-seqs", type=int, default=64, help="TRL's per-device batch (rlfleet keeps "
                   "its learner.micro_batch_tokens)")
    p.add_argument("--work-dir", default="/tmp/rlfleet-small-job")
    p.add_argument("--arm-timeout-s", type=float, default=300.0)
    p.add_argument("--rlfleet-override", action="append", default=[], metavar="KEY=VALUE",
                   help="extra rlfleet config override for both rlfleet arms (repeatable)")
    p.add_argument("--baseline-repo", default=None, help="a checkout of an earlier rlfleet: its sync and "
                   "async runs join every round (arms before-sync, before-async), for a paired before/after")
    p.add_argument("--out", help="also write every run as JSON here")
    args = p.parse_args(argv)
    args.arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if bad := set(args.arms) - set(ARMS) - set(BEFORE_ARMS):
        p.error(f"unknown arms {sorted(bad)}")
    if args.baseline_repo and not any(a.startswith("before-") for a in args.arms):
        args.arms = [*BEFORE_ARMS, *args.arms]
    if args.warmup_steps < 1:
        p.error("--warmup-steps must be >= 1: the measurement starts at the end of a step")
    return args


def job_settings(args) -> dict:
    """The job every arm runs: the command line, else the --config file, else rlfleet's defaults
    (32 prompts x 8 samples without a file), so TRL runs the same job as rlfleet."""
    from rlfleet.config import load_config

    cfg = load_config(args.config, [f"model.path={args.model}"] if args.model else [])
    if args.data:
        cfg.data.train_files = [args.data]
    default_n, default_prompts = (cfg.rollout.n, cfg.controller.prompts_per_step) if args.config else (8, 32)
    args.n = args.n or default_n
    args.prompts_per_step = args.prompts_per_step or default_prompts
    model = cfg.model.path if cfg.model.path.startswith("builtin:") else str(Path(cfg.model.path).resolve())
    return {"lr": args.lr if args.lr is not None else cfg.learner.lr,
            "max_new_tokens": args.max_new_tokens or cfg.rollout.max_new_tokens,
            "temperature": cfg.rollout.temperature, "model": model,  # absolute: the arms run in other folders
            "data": str(Path(cfg.data.train_files[0]).resolve()) if cfg.data.train_files else None}


def rlfleet_overrides(args, job: dict, name: str, staleness: int | None) -> list[str]:
    out = [f"run.name={name}", f"run.output_dir={args.work_dir}/runs", "run.max_restarts=0",
           f"model.path={job['model']}", "controller.eval_every=0",
           f"rollout.temperature={job['temperature']}", f"rollout.n={args.n}",
           f"rollout.max_new_tokens={job['max_new_tokens']}",
           f"learner.lr={job['lr']}", f"controller.prompts_per_step={args.prompts_per_step}",
           f"controller.max_steps={args.warmup_steps + args.steps}"]
    # TensorBoard stays at its default (on): the job measured is `rlfleet run` as a user starts it
    if job["data"]:
        out.append(f"data.train_files=[{job['data']}]")
    if staleness is not None:
        out.append(f"controller.max_staleness={staleness}")
    if args.device == "cpu":
        out += ["rollout.device=cpu", "learner.device=cpu"]
    # cuda: the default device=auto, under which rollout and learner share the one GPU (weights over gloo)
    return out + list(args.rlfleet_override)


def run_rlfleet(args, job: dict, arm: str, rnd: int, env: dict) -> ArmRun:
    name = f"{arm}-r{rnd}"
    run_dir = Path(args.work_dir) / "runs" / name
    shutil.rmtree(run_dir, ignore_errors=True)
    staleness = 0 if arm.endswith("sync") and not arm.endswith("async") else None  # async: the default
    repo = REPO
    if arm.startswith("before-"):  # the earlier checkout's code, first on the path (`-m` puts the cwd first)
        repo = Path(args.baseline_repo).resolve()
        env = dict(env, PYTHONPATH=os.pathsep.join([str(repo), env["PYTHONPATH"]]))
    cmd = [sys.executable, "-m", "rlfleet.app.cli", "run", *(["--config", str(Path(args.config).resolve())]
                                                             if args.config else []),
           *rlfleet_overrides(args, job, name, staleness)]
    log_path = Path(args.work_dir) / f"{name}.log"
    result = ArmRun(arm, rnd)
    metrics_path = run_dir / "metrics.jsonl"
    lines: list[dict] = []
    cpu_marks: dict[int, float] = {}
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=repo,
                                start_new_session=True)
        memory = TreeMemory(proc.pid, gpu=args.device == "cuda")
        metrics = JsonlFollower(metrics_path)
        try:
            while True:
                now = time.perf_counter() - t0
                for line in metrics.new_lines():
                    if "timing/step_s" in line:
                        record = _record(line, now)
                        result.steps.append((record.step, now, record.samples))
                        lines.append(line)
                        cpu_marks[record.step] = cpu_seconds(proc.pid)
                if proc.poll() is not None:
                    break
                if now > args.arm_timeout_s:
                    result.error = f"timed out after {args.arm_timeout_s:.0f}s"
                    break
                time.sleep(0.02)
        finally:
            result.memory = memory.stop()
            _stop(proc)
    if proc.returncode not in (0, None) and not result.error:
        result.error = f"exit {proc.returncode}; log {log_path}"
    result.cpu_s = _cpu_window(cpu_marks, args.warmup_steps)
    measured = [ln for ln in lines if ln["step"] > args.warmup_steps]
    for key in ("timing/gen_s", "timing/reward_s", "timing/train_s", "timing/weight_sync_s", "timing/step_s"):
        values = [float(ln[key]) for ln in measured if ln.get(key) is not None]
        if values:
            result.extra[key] = statistics.median(values)
    return result


def _cpu_window(marks: dict[int, float], warmup: int) -> float | None:
    last = max(marks, default=None)
    if warmup not in marks or last is None or last <= warmup:
        return None
    return marks[last] - marks[warmup]


def run_trl(args, job: dict, rnd: int, model_dir: Path, rows_file: Path, env: dict,
            arm: str = "trl") -> ArmRun:
    result = ArmRun(arm, rnd)
    work = Path(args.work_dir)
    steps_file = work / f"{arm}-r{rnd}.steps.jsonl"
    steps_file.unlink(missing_ok=True)
    cuda = args.device == "cuda"
    t0 = time.time()
    params = {"model_dir": str(model_dir), "rows_file": str(rows_file), "steps_file": str(steps_file),
              "output_dir": str(work / "trl_out"), "cuda": cuda, "seed": 0, "n": args.n,
              "prompts_per_step": args.prompts_per_step,
              "micro_batch_seqs": min(args.micro_batch_seqs, args.prompts_per_step * args.n),
              "max_new_tokens": job["max_new_tokens"], "lr": job["lr"], "temperature": job["temperature"],
              "max_steps": args.warmup_steps + args.steps, "t0": t0}
    params_file = work / f"{arm}-r{rnd}.json"
    params_file.write_text(json.dumps(params))
    child_env = dict(env, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                     HF_DATASETS_CACHE=str(work / "hf_datasets"), WANDB_DISABLED="true")
    log_path = work / f"{arm}-r{rnd}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, str(REPO / "bench" / "e2e_trl.py"), str(params_file)],
                                stdout=log, stderr=subprocess.STDOUT, env=child_env, start_new_session=True)
        memory = TreeMemory(proc.pid, gpu=args.device == "cuda")
        cpu_marks: dict[int, float] = {}
        steps = JsonlFollower(steps_file)
        try:
            while proc.poll() is None:  # the steps file is read as it grows, to stamp the CPU time
                if time.time() - t0 > args.arm_timeout_s:
                    result.error = f"timed out after {args.arm_timeout_s:.0f}s"
                    proc.kill()
                    break
                for line in steps.new_lines():
                    cpu_marks[line["step"]] = cpu_seconds(proc.pid)
                time.sleep(0.02)
            if proc.wait() != 0 and not result.error:
                result.error = f"exit {proc.returncode}; log {log_path}"
        finally:
            result.memory = memory.stop()
            if proc.poll() is None:  # interrupted: the TRL process must not outlive the bench
                proc.kill()
                proc.wait()
    result.cpu_s = _cpu_window(cpu_marks, args.warmup_steps)
    if steps_file.exists():
        for text in steps_file.read_text().splitlines():
            d = json.loads(text)
            result.steps.append((d["step"], d["t"] - t0, d["samples"]))
    return result


def _median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _paired(mine: list[ArmRun], ref: dict[int, ArmRun], value) -> list[float]:
    """value(run) / value(that round's reference run), for the rounds where both have one."""
    return [value(r) / value(ref[r.round]) for r in mine
            if r.round in ref and value(r) and value(ref[r.round])]


def _fmt(v: float | None, spec: str) -> str:
    return format(v, spec) if v is not None else "-"


def _ratio_cell(ratios: list[float]) -> str:
    if not ratios:
        return "-"
    return f"{statistics.median(ratios):.2f}x (" + ", ".join(f"{x:.2f}" for x in ratios) + ")"


def summary_table(runs: list[ArmRun], warmup: int) -> str:
    """Medians over rounds; ratios are per round (paired with that round's TRL run) then the median:
    samples/s against TRL and against TRL on one thread (see ARMS), time to the first step against TRL."""
    trl = {r.round: r for r in runs if r.arm == "trl"}
    trl1 = {r.round: r for r in runs if r.arm == "trl-1t"}
    gpu = any(r.memory.gpu_mb for r in runs)
    head = ("arm", "samples/s", "vs TRL (paired)", "vs TRL 1 thread", "CPU ms/sample", "first step s",
            "vs TRL", "memory RSS MB", "PSS MB", "per process (RSS MB)",
            *(("GPU MB", "per process (GPU MB)") if gpu else ()))
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm in (*BEFORE_ARMS, *ARMS):
        mine = [r for r in runs if r.arm == arm]
        if not mine:
            continue

        def rate(r: ArmRun) -> float | None:
            return r.samples_per_s(warmup)

        def first(r: ArmRun) -> float | None:
            return r.first_step_s()

        labels = sorted({k for r in mine for k in r.memory.by_label_rss})
        split = ", ".join(f"{k} {_median([r.memory.by_label_rss.get(k, 0.0) for r in mine]):.0f}"
                          for k in labels)
        cells = [arm, _fmt(_median([rate(r) for r in mine]), ".1f"), _ratio_cell(_paired(mine, trl, rate)),
                 _ratio_cell(_paired(mine, trl1, rate)),
                 _fmt(_median([r.cpu_ms_per_sample(warmup) for r in mine]), ".2f"),
                 _fmt(_median([first(r) for r in mine]), ".1f"), _ratio_cell(_paired(mine, trl, first)),
                 _fmt(_median([r.memory.rss_mb for r in mine]), ".0f"),
                 _fmt(_median([r.memory.pss_mb for r in mine]), ".0f"), split]
        if gpu:
            gpu_labels = sorted({k for r in mine for k in r.memory.by_label_gpu})
            cells += [_fmt(_median([r.memory.gpu_mb for r in mine]), ".0f"),
                      ", ".join(f"{k} {_median([r.memory.by_label_gpu.get(k, 0.0) for r in mine]):.0f}"
                                for k in gpu_labels)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    env = subprocess_env(REPO)
    job = job_settings(args)

    from rlfleet.models.resolve import resolve_model_path

    model_dir = resolve_model_path(job["model"])  # the tiny model is built (and cached) here, not timed
    rows_file = Path(job["data"]) if job["data"] else work / "prompts.parquet"
    if not job["data"]:
        from rlfleet.config import JobConfig
        from rlfleet.data import tasks

        tasks.write_parquet(rows_file, JobConfig().data.builtin_size, 0)
    print(f"small job: {job['model']} ({model_dir}), {args.prompts_per_step} prompts x {args.n} samples per "
          f"step, {job['max_new_tokens']} new tokens, lr {job['lr']}, {args.warmup_steps} warm-up + "
          f"{args.steps} measured steps, {args.rounds} rounds, device {args.device}", flush=True)

    runs: list[ArmRun] = []
    for rnd in range(1, args.rounds + 1):
        for arm in args.arms:
            if arm.startswith("trl"):
                run = run_trl(args, job, rnd, model_dir, rows_file,
                              dict(env, OMP_NUM_THREADS="1") if arm == "trl-1t" else env, arm)
            else:
                run = run_rlfleet(args, job, arm, rnd, env)
            runs.append(run)
            sps, cpu = run.samples_per_s(args.warmup_steps), run.cpu_ms_per_sample(args.warmup_steps)
            print(f"round {rnd} {arm:5s}: {len(run.steps)} steps, first step {run.first_step_s() or 0:.1f}s, "
                  f"{sps or 0:.1f} samples/s, {cpu or 0:.2f} CPU ms/sample, "
                  f"load {os.getloadavg()[0]:.1f}, memory RSS {run.memory.rss_mb:.0f} MB / PSS "
                  f"{run.memory.pss_mb:.0f} MB ("
                  + ", ".join(f"{k} {v:.0f}" for k, v in sorted(run.memory.by_label_rss.items())) + ")"
                  + (f", GPU {run.memory.gpu_mb:.0f} MB" if run.memory.gpu_mb else "")
                  + ("; " + ", ".join(f"{k.split('/')[1]} {v * 1000:.0f}ms" for k, v in run.extra.items())
                     if run.extra else "")
                  + (f"; ERROR {run.error}" if run.error else ""), flush=True)

    print(f"\nsmall job ({job['model']}, {args.device}): medians over {args.rounds} rounds")
    print(summary_table(runs, args.warmup_steps))
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "job": job,
                                              "runs": [asdict(r) for r in runs]}, indent=2, default=str))
    return 1 if any(r.error for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
