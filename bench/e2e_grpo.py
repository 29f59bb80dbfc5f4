"""End-to-end GRPO throughput: rlfleet asynchronous vs rlfleet synchronous vs TRL's GRPOTrainer.

The same job three ways, one after the other, in one invocation:
  (a) rlfleet-async   `python -m rlfleet.app.cli run`, rollout on GPU --rollout-gpu, learner on GPU
                      --learner-gpu (weights over NCCL), controller.max_staleness=--staleness (1)
  (b) rlfleet-sync    the same with controller.max_staleness=0 (on-policy, no overlap)
  (c) trl             trl.GRPOTrainer on GPU --trl-gpu, transformers generate (no vLLM)
Same model (a Qwen2 of --shape with random weights and the tiny model's digit tokenizer, vocab
padded to the shape's), same prompts (the built-in digits_reverse task), group size, prompts per
step, max new tokens, lr, bf16 on CUDA, reward (services/reward/fns/digits.py).

Throughput comes from each run's own per-step output (rlfleet: metrics.jsonl; TRL: a callback
plus the reward function counting completion tokens), from the end of step --warmup-steps to
the end of the last step, so start-up and the first steps (CUDA warm-up, pipeline fill) are out.

  python bench/e2e_grpo.py                                  # 0.5B on 2 GPUs: 32 prompts x 8, 256 new tokens
  python bench/e2e_grpo.py --shape tiny --device cpu        # smoke test of all three arms on a CPU
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import e2e_rlfleet, e2e_trl  # noqa: E402 - after the sys.path insert above
from bench.e2e_common import (  # noqa: E402
    SHAPES,
    build_model_dir,
    format_table,
    max_prompt_tokens,
    subprocess_env,
    write_prompts,
)

# shape -> defaults: prompts per step, group size, max new tokens, measured steps, warm-up steps, micro-batch
# seqs
DEFAULTS = {"0.5b": (32, 8, 256, 10, 2, 32), "tiny": (8, 4, 32, 5, 2, 16)}
ARMS = ("async", "sync", "trl")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="0.5b")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--arms", default=",".join(ARMS), help="comma-separated subset of async,sync,trl")
    p.add_argument("--prompts-per-step", type=int)
    p.add_argument("--n", type=int, help="group size (rollout.n / num_generations)")
    p.add_argument("--max-new-tokens", type=int)
    p.add_argument("--steps", type=int, help="measured optimizer steps")
    p.add_argument("--warmup-steps", type=int, help="steps excluded from the measurement (>= 1)")
    p.add_argument("--micro-batch-seqs", type=int, help="sequences per learner micro-batch (TRL: per-device "
                   "batch; rlfleet: learner.micro_batch_tokens = this x (longest prompt + max new tokens))")
    p.add_argument("--prompts-per-request", type=int, default=0,
                   help="rlfleet controller.prompts_per_request; "
                   "0: prompts per step (one Generate call per step, like TRL's one generate call)")
    p.add_argument("--staleness", type=int, default=1, help="controller.max_staleness of the async arm")
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-prompts", type=int, default=4096, help="rows in the prompt file")
    p.add_argument("--rollout-gpu", type=int, default=0)
    p.add_argument("--learner-gpu", type=int, default=1)
    p.add_argument("--trl-gpu", type=int, default=0)
    p.add_argument("--work-dir", default="/tmp/rlfleet-e2e-grpo")
    p.add_argument("--cache-dir", default=None,
                   help="where the model folder is built; default WORK_DIR/models")
    p.add_argument("--arm-timeout-s", type=float, default=200.0, help="an arm still running then is stopped "
                   "and measured over the steps it finished")
    p.add_argument("--rlfleet-override", action="append", default=[], metavar="KEY=VALUE",
                   help="extra rlfleet config override for both rlfleet arms (repeatable)")
    p.add_argument("--out", help="also write the results as JSON here")
    args = p.parse_args(argv)
    names = ("prompts_per_step", "n", "max_new_tokens", "steps", "warmup_steps", "micro_batch_seqs")
    for name, default in zip(names, DEFAULTS[args.shape]):
        if getattr(args, name) is None:
            setattr(args, name, default)
    args.micro_batch_seqs = min(args.micro_batch_seqs, args.prompts_per_step * args.n)
    if (args.prompts_per_step * args.n) % args.micro_batch_seqs:
        p.error("--micro-batch-seqs must divide prompts-per-step x n (TRL's gradient accumulation)")
    if args.warmup_steps < 1:
        p.error("--warmup-steps must be >= 1: the measurement starts at the end of a step")
    args.arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if bad := set(args.arms) - set(ARMS):
        p.error(f"unknown arms {sorted(bad)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    env = subprocess_env(REPO)

    t = time.perf_counter()
    model_dir = build_model_dir(args.shape, Path(args.cache_dir or work / "models"), args.device, args.seed)
    rows_file = work / "prompts.parquet"
    rows = write_prompts(rows_file, args.num_prompts, args.seed)
    prompt_len = max_prompt_tokens(model_dir, rows)
    micro_batch_tokens = args.micro_batch_seqs * (prompt_len + args.max_new_tokens)
    print(f"model {model_dir} ({args.shape}) and {len(rows)} prompts (longest {prompt_len} tokens) ready in "
          f"{time.perf_counter() - t:.1f}s", flush=True)
    print(f"job: {args.prompts_per_step} prompts x {args.n} samples per step, {args.max_new_tokens} new "
          "tokens, "
          f"{args.warmup_steps} warm-up + {args.steps} measured steps, lr {args.lr}, micro-batch "
          f"{args.micro_batch_seqs} seqs ({micro_batch_tokens} tokens), device {args.device}", flush=True)

    results = []
    for arm in args.arms:
        t = time.perf_counter()
        print(f"--- {arm} ...", flush=True)
        if arm == "trl":
            result = e2e_trl.run_arm(args, model_dir=model_dir, rows_file=rows_file,
                                     micro_batch_seqs=args.micro_batch_seqs, env=env)
        else:
            staleness = args.staleness if arm == "async" else 0
            result = e2e_rlfleet.run_arm(args, name=f"rlfleet-{arm}", staleness=staleness,
                                         model_dir=model_dir,
                                         parquet=rows_file, micro_batch_tokens=micro_batch_tokens, env=env)
            result.name = f"rlfleet-{arm} (s={staleness})"
        status = f"error: {result.error}" if result.error else "ok"
        if result.error and result.measured(args.warmup_steps):
            status = f"partial ({result.error}); measured over the steps it finished"
        print(f"--- {arm}: {len(result.steps)} steps in {time.perf_counter() - t:.1f}s, {status}", flush=True)
        for s in result.steps:
            print(f"    step {s.step:3d}  t={s.t_end:7.2f}s  samples {s.samples}  gen tokens {s.gen_tokens}  "
                  + "  ".join(f"{k}={v:.3g}" for k, v in s.extra.items()
                              if isinstance(v, (int, float)) and k != "reward"), flush=True)
        results.append(result)

    print(f"\nE2E GRPO throughput, {args.shape} shape on {args.device}: {args.prompts_per_step} prompts x "
          f"{args.n} "
          f"samples/step, max {args.max_new_tokens} new tokens; measured from the end of step "
          f"{args.warmup_steps} "
          f"to the end of step {args.warmup_steps + args.steps}")
    print(format_table(results, args.warmup_steps))
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "results": [
            {"name": r.name, "measured": r.measured(args.warmup_steps), "total_s": r.total_s, "note": r.note,
             "error": r.error, "steps": [vars(s) for s in r.steps]} for r in results]}, indent=2,
             default=str))
    return 1 if any(not r.measured(args.warmup_steps) for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
