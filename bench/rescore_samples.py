"""Greedy accuracy of stored responses under several reward rules, without generating again: the
samples `rlfleet eval` writes (`<report>.samples.jsonl`) or a run's `samples/val.jsonl` (one block per
evaluated step), re-scored by rlfleet's reward core with each `reward.fn`, each response told how its
generation ended (a response cut at the budget is scored as the rule says).

    python bench/rescore_samples.py base=eval.samples.jsonl grpo=run/samples/val.jsonl \\
        --fn gsm8k --fn gsm8k_flexible --fn gsm8k_lenient --out PREFIX    # PREFIX.json, PREFIX.md

Each input is LABEL=PATH; a val.jsonl gives one row per step it holds (LABEL@step), or only the
step given as LABEL=PATH@STEP.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FIELDS = ("data_source", "response", "ground_truth", "finish_reason")


class InputError(ValueError):
    """One line naming the file and what is wrong with it."""


def read_samples(spec: str) -> list[tuple[str, list[dict]]]:
    """LABEL=PATH[@STEP] -> [(label, samples)], one entry per evaluated step of a val.jsonl."""
    label, sep, rest = spec.partition("=")
    if not sep or not label or not rest:
        raise InputError(f"{spec!r}: inputs are LABEL=PATH or LABEL=PATH@STEP")
    path_text, _, step_text = rest.partition("@")
    path = Path(path_text)
    try:
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    except json.JSONDecodeError:
        raise InputError(f"{path}: not a JSONL file of samples") from None
    for number, line in enumerate(lines, 1):
        missing = [f for f in FIELDS if f not in line]
        if missing:
            raise InputError(f"{path}: sample {number} lacks {', '.join(missing)}")
    by_step: dict[int | None, list[dict]] = defaultdict(list)
    for line in lines:
        by_step[line.get("step")].append(line)
    if step_text:
        step = int(step_text)
        if step not in by_step:
            steps = sorted(k for k in by_step if k is not None)
            raise InputError(f"{path}: no samples of step {step} (steps: {steps})")
        return [(label, by_step[step])]
    if list(by_step) == [None]:
        return [(label, by_step[None])]
    return [(f"{label}@{step}", samples) for step, samples in sorted(by_step.items())]


def rescore(samples: list[dict], fn: str) -> dict:
    """{"fn", "rules" (per data_source), "samples", "correct", "accuracy", "failed"}: correct = full score."""
    from rlfleet.eval.scoring import CORRECT_AT
    from rlfleet.types import ScoreItem
    from services.reward.registry import rule_label
    from services.reward.scorer import RewardScorer

    scorer = RewardScorer(fn)
    items = [ScoreItem(str(i), s["data_source"], s.get("prompt", ""), s["response"], s["ground_truth"], {},
                       s["finish_reason"]) for i, s in enumerate(samples)]
    results = scorer.score(items)
    scored = [r.score for r in results if r.ok]
    correct = sum(score >= CORRECT_AT for score in scored)
    sources = sorted({s["data_source"] for s in samples})
    return {"fn": fn, "rules": {src: rule_label(fn, src) for src in sources},
            "samples": len(samples), "correct": correct, "failed": len(samples) - len(scored),
            "accuracy": correct / len(scored) if scored else None}


def markdown(rows: list[dict], fns: list[str]) -> str:
    lines = ["| model | samples | " + " | ".join(f"`{fn}`" for fn in fns) + " |",
             "|---|---|" + "---|" * len(fns)]
    for row in rows:
        cells = []
        for fn in fns:
            r = row["by_fn"][fn]
            cells.append("–" if r["accuracy"] is None else f"{100 * r['accuracy']:.2f} % ({r['correct']})")
        lines.append(f"| {row['label']} | {row['samples']} | " + " | ".join(cells) + " |")
    rules = {fn: rule for row in rows for fn in fns for rule in row["by_fn"][fn]["rules"].values()}
    lines += ["", "Rules: " + "; ".join(f"`{fn}` = {rule}" for fn, rule in rules.items()) + "."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("inputs", nargs="+", metavar="LABEL=PATH[@STEP]")
    p.add_argument("--fn", action="append", required=True, help="a reward.fn to score with (repeat)")
    p.add_argument("--out", type=Path, help="writes OUT.json and OUT.md")
    args = p.parse_args(argv)
    from rlfleet.errors import RlfleetError

    try:
        groups = [group for spec in args.inputs for group in read_samples(spec)]
        rows = [{"label": label, "samples": len(samples),
                 "by_fn": {fn: rescore(samples, fn) for fn in args.fn}} for label, samples in groups]
    except (InputError, RlfleetError, ValueError) as exc:
        print(f"rescore_samples: {exc}", file=sys.stderr)
        return 2
    text = markdown(rows, args.fn)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
        args.out.with_suffix(".md").write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
