"""Which reasoning-gym task the recipe trains on, from the base model's evaluation (`rg-base.json`).

Judged by accuracy **over the task's majority-answer baseline** (the accuracy of always giving its most
frequent ground truth: `majority_baseline` in the eval report), not by raw accuracy: on letter_counting
a policy that answers "1" to everything scores 34 % and has learned nothing (issue 45). The recipe
(docs/recipes/reasoning-gym-smollm2.md) wants a task whose base model is 5-30 points above its baseline:
below, GRPO's groups are mostly all wrong (or right only by the common answer) and carry little signal;
above, little is left to learn. Of the tasks in that band the one nearest 15 points is taken; with none
in it, the task furthest above its baseline below the band (some skill beats none); with none, an error
naming each task's accuracy and baseline.

    python bench/rg_pick_task.py rg-base.json      # prints the task name, e.g. chain_sum
                                                   # (and the table it chose from, on stderr)
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

PREFIX = "reasoning_gym/"
BAND = (0.05, 0.30)  # accuracy minus the majority-answer baseline
AIM = 0.15


@dataclass(frozen=True)
class TaskScore:
    accuracy: float
    baseline: float  # the majority-answer baseline
    top_share: float | None = None  # share of the model's most common answer

    @property
    def gain(self) -> float:
        return self.accuracy - self.baseline


def pick_task(scores: dict[str, TaskScore]) -> str:
    """`scores`: task name -> its base accuracy and majority-answer baseline, in [0, 1]."""
    in_band = [t for t, s in scores.items() if BAND[0] - 1e-9 <= s.gain <= BAND[1] + 1e-9]
    if in_band:
        return min(in_band, key=lambda t: (abs(scores[t].gain - AIM), t))
    below = [t for t, s in scores.items() if 1e-9 < s.gain < BAND[0]]
    if below:
        return max(below, key=lambda t: (scores[t].gain, t))
    raise ValueError("no task is between 0 and 30 points above its majority-answer baseline: "
                     + ", ".join(f"{t} {s.accuracy:.1%} (baseline {s.baseline:.1%})"
                                 for t, s in sorted(scores.items())))


def task_scores(report: dict) -> dict[str, TaskScore]:
    """Task -> scores from an `rlfleet eval` report's `by_source` (`reasoning_gym/TASK` rows; no
    accuracy, every reward failed: 0). A row without `majority_baseline` is an error: the report is
    older than the baseline column, and raw accuracy is what this script must not judge by."""
    out = {}
    for src, row in report["by_source"].items():
        if not src.startswith(PREFIX):
            continue
        if row.get("majority_baseline") is None:
            raise ValueError(f"{src} has no majority_baseline (an rlfleet eval report from before the "
                             "baseline column): evaluate the base model again")
        out[src[len(PREFIX):]] = TaskScore(row["accuracy"] or 0.0, row["majority_baseline"],
                                           row.get("top_answer_share"))
    if not out:
        raise ValueError("the report has no reasoning_gym/ data source")
    return out


def table(scores: dict[str, TaskScore]) -> str:
    lines = [f"{'task':<20} {'accuracy':>8} {'baseline':>8} {'gain':>7} {'top':>6}"]
    for t, s in sorted(scores.items(), key=lambda kv: -kv[1].gain):
        top = f"{s.top_share:6.2f}" if s.top_share is not None else f"{'-':>6}"
        lines.append(f"{t:<20} {s.accuracy:8.1%} {s.baseline:8.1%} {s.gain * 100:+6.1f}p {top}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", type=Path, help="rlfleet eval --output of the base model over the tasks")
    args = ap.parse_args()
    try:
        scores = task_scores(json.loads(args.report.read_text()))
        print(table(scores), file=sys.stderr)
        print(pick_task(scores))
    except (OSError, ValueError, KeyError) as exc:
        print(f"rg_pick_task: {args.report}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
