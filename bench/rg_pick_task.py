"""Which reasoning-gym task the recipe trains on, from the base model's evaluation (`rg-base.json`).

The recipe (docs/recipes/reasoning-gym-smollm2.md) wants a task the base model solves 5-30 % of the
time: below, GRPO's groups are mostly all wrong and carry no signal; above, little is left to learn.
Of the tasks in that band the one nearest 15 % is taken; with none in it, the best task under 5 % that
the model solves at all (some signal beats none); with none solved at all, an error.

    python bench/rg_pick_task.py rg-base.json      # prints the task name, e.g. chain_sum
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PREFIX = "reasoning_gym/"
BAND = (0.05, 0.30)
AIM = 0.15


def pick_task(accuracy: dict[str, float]) -> str:
    """`accuracy`: task name -> base accuracy in [0, 1]."""
    in_band = [t for t, a in accuracy.items() if BAND[0] <= a <= BAND[1]]
    if in_band:
        return min(in_band, key=lambda t: (abs(accuracy[t] - AIM), t))
    solved = [t for t, a in accuracy.items() if 0 < a < BAND[0]]
    if solved:
        return max(solved, key=lambda t: (accuracy[t], t))
    raise ValueError("the base model solves none of the tasks: "
                     + ", ".join(f"{t} {a:.1%}" for t, a in sorted(accuracy.items())))


def task_accuracies(report: dict) -> dict[str, float]:
    """Task -> accuracy from an `rlfleet eval` report's `by_source` (`reasoning_gym/TASK` rows; no
    accuracy, every reward failed: 0)."""
    return {src[len(PREFIX):]: row["accuracy"] or 0.0 for src, row in report["by_source"].items()
            if src.startswith(PREFIX)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", type=Path, help="rlfleet eval --output of the base model over the tasks")
    args = ap.parse_args()
    try:
        print(pick_task(task_accuracies(json.loads(args.report.read_text()))))
    except (OSError, ValueError, KeyError) as exc:
        print(f"rg_pick_task: {args.report}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
