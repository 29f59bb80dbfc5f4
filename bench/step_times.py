"""Medians of a run's per-step timing and throughput metrics (metrics.jsonl), steps FIRST..LAST.

Usage: python bench/step_times.py RUN/metrics.jsonl [more ...] [--first 6] [--last N] [--json F]
Prints one line per file: s/step, generation, learner step, train call, weight sync, waiting,
trained and generated tokens per step and per second, learner MFU.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

KEYS = ("timing/step_s", "timing/gen_s", "timing/learner_step_s", "timing/train_s", "timing/weight_sync_s",
        "timing/wait_s", "perf/learner_mfu", "learner/tokens", "response_length/mean", "perf/samples_per_s",
        "reward/mean")


def summarize(path: Path, first: int, last: int | None) -> dict[str, float]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    steps = [r for r in rows if "actor/pg_loss" in r and r.get("step", 0) >= first
             and (last is None or r["step"] <= last)]
    out: dict[str, float] = {"steps": float(len(steps))}
    for key in KEYS:
        values = [float(r[key]) for r in steps if key in r]
        if values:
            out[key] = statistics.median(values)
    if "learner/tokens" in out and "timing/learner_step_s" in out:
        out["learner_response_tok_s"] = out["learner/tokens"] / out["timing/learner_step_s"]
    if "learner/tokens" in out and "timing/gen_s" in out:
        out["generated_tok_s"] = out["learner/tokens"] / out["timing/gen_s"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--first", type=int, default=6)
    ap.add_argument("--last", type=int)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    report = {}
    for f in args.files:
        s = report[str(f)] = summarize(f, args.first, args.last)

        def g(key, fmt=".3f"):
            return format(s[key], fmt) if key in s else "-"
        print(f"{f.name}: {g('steps', '.0f')} steps  step {g('timing/step_s')} s  gen {g('timing/gen_s')}  "
              f"learner {g('timing/learner_step_s')}  train-call {g('timing/train_s')}  "
              f"sync {g('timing/weight_sync_s')}  wait {g('timing/wait_s')}  "
              f"tokens {g('learner/tokens', '.0f')}  gen tok/s {g('generated_tok_s', ',.0f')}  "
              f"learner tok/s {g('learner_response_tok_s', ',.0f')}  mfu {g('perf/learner_mfu')}  "
              f"reward {g('reward/mean')}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
