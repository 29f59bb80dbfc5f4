"""Held-out accuracy per arm, step and seed, from what bench/onegpu_session.sh's `parity` and `staleness`
phases leave: mean ± sd over seeds and the per-seed figures, as JSON and a markdown table.

    python bench/parity_table.py DIR_OR_JSON... --out PREFIX     # writes PREFIX.json and PREFIX.md

Each input is a folder of raw results or a table JSON this script wrote before (so the parity phase's
table and the staleness phase's merge into one). In a folder:
  - `metrics-ARM-seedK.jsonl`: an `rlfleet run`'s metrics.jsonl; its `val/accuracy` lines (the run's own
    greedy evaluations, step 0 with eval_before_train), the mean `reward/mean` of its training steps
    between evaluations and the median `timing/step_s` (side by side with the others: not a run's speed
    alone);
  - `eval-ARM-seedK-stepN.json`: an `rlfleet eval` report of arm ARM's seed K after N steps (the TRL
    checkpoints), `overall.accuracy`;
  - `trl_steps-ARM-seedK.jsonl`: bench/gsm8k_trl.py's per-step train rewards and times;
  - `eval-base.json`: the base model's `rlfleet eval`, step 0 of every arm and seed that has no step 0
    of its own (greedy decoding of one model: the same for every seed).
ARM is a name without `-seed` in it (`trl`, `rlfleet-S0`, ...). A later input's figure for the same arm,
seed and step replaces an earlier one's.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tarfile
import tempfile
from collections import defaultdict
from pathlib import Path

METRICS = re.compile(r"^metrics-(?P<arm>.+)-seed(?P<seed>\d+)\.jsonl$")
EVAL = re.compile(r"^eval-(?P<arm>.+)-seed(?P<seed>\d+)-step(?P<step>\d+)\.json$")
TRL_STEPS = re.compile(r"^trl_steps-(?P<arm>.+)-seed(?P<seed>\d+)\.jsonl$")
BASE = "eval-base.json"


class InputError(ValueError):
    """One line naming the file and what is wrong with it."""


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: not a readable JSON file ({exc})") from None


def _read_jsonl(path: Path) -> list[dict]:
    """The JSON lines of `path`; a last line cut short (a run stopped mid-write) is left out."""
    raw = [line for line in path.read_text().splitlines() if line.strip()]
    lines = []
    for number, line in enumerate(raw, 1):
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(raw):
                break
            raise InputError(f"{path}: line {number} is not JSON") from None
    return lines


def _eval_accuracy(path: Path) -> tuple[float, str, int]:
    report = _read_json(path)
    try:
        accuracy = report["overall"]["accuracy"]
        prompts = int(report["overall"]["prompts"])
    except (KeyError, TypeError, ValueError):
        raise InputError(f"{path}: not an `rlfleet eval` report (no overall.accuracy / overall.prompts)") \
            from None
    rules = sorted({s.get("rule", "") for s in report.get("by_source", {}).values()} - {""})
    return float(accuracy), "; ".join(rules), prompts


def _windows(steps_rewards: list[tuple[int, float]], bounds: list[int]) -> dict[int, float]:
    """Mean train reward of the steps in (previous bound, bound], keyed by the bound."""
    out = {}
    for low, high in zip([0, *bounds], bounds):
        values = [r for s, r in steps_rewards if low < s <= high]
        if values:
            out[high] = sum(values) / len(values)
    return out


def read_folder(folder: Path) -> tuple[list[dict], dict | None]:
    """(records, base): one record per arm, seed and evaluated step."""
    records: list[dict] = []
    rewards: dict[tuple[str, int], list[tuple[int, float]]] = {}
    seconds: dict[tuple[str, int], list[float]] = {}  # per training step, for the median
    for path in sorted(folder.iterdir()):
        if m := METRICS.match(path.name):
            arm, seed = m["arm"], int(m["seed"])
            lines = _read_jsonl(path)
            for line in lines:
                if "val/accuracy" in line and "step" in line:
                    records.append({"arm": arm, "seed": seed, "step": int(line["step"]),
                                    "accuracy": float(line["val/accuracy"]), "from": path.name})
            rewards[(arm, seed)] = [(int(line["step"]), float(line["reward/mean"])) for line in lines
                                    if "reward/mean" in line and "step" in line]
            seconds[(arm, seed)] = [float(line["timing/step_s"]) for line in lines if "timing/step_s" in line]
        elif m := EVAL.match(path.name):
            accuracy, rule, prompts = _eval_accuracy(path)
            records.append({"arm": m["arm"], "seed": int(m["seed"]), "step": int(m["step"]),
                            "accuracy": accuracy, "rule": rule, "prompts": prompts, "from": path.name})
        elif m := TRL_STEPS.match(path.name):
            lines = _read_jsonl(path)
            rewards[(m["arm"], int(m["seed"]))] = [(int(line["step"]), float(line["reward"]))
                                                   for line in lines if "reward" in line]
            times = [float(line["t"]) for line in lines if "t" in line]  # seconds since the start
            seconds[(m["arm"], int(m["seed"]))] = [b - a for a, b in zip(times, times[1:])]
    base = None
    if (folder / BASE).is_file():
        accuracy, rule, prompts = _eval_accuracy(folder / BASE)
        base = {"accuracy": accuracy, "rule": rule, "prompts": prompts, "from": BASE}
    for (arm, seed), pairs in rewards.items():
        bounds = sorted({r["step"] for r in records if r["arm"] == arm and r["seed"] == seed} - {0})
        for step, value in _windows(pairs, bounds).items():
            for record in records:
                if (record["arm"], record["seed"], record["step"]) == (arm, seed, step):
                    record["train_reward"] = value
    for record in records:
        if seconds.get((record["arm"], record["seed"])):
            record["s_per_step"] = statistics.median(seconds[(record["arm"], record["seed"])])
    return records, base


def read_input(path: Path) -> tuple[list[dict], dict | None]:
    if path.is_dir():
        return read_folder(path)
    if path.name.endswith((".tgz", ".tar.gz")):  # a phase's raw results as they come back
        with tempfile.TemporaryDirectory() as tmp, tarfile.open(path) as tar:
            tar.extractall(tmp, filter="data")
            folders = [p for p in Path(tmp).rglob("*") if p.is_dir()] + [Path(tmp)]
            found = [read_folder(f) for f in folders]
            records = [r for recs, _ in found for r in recs]
            base = next((b for _, b in found if b is not None), None)
            return records, base
    if path.is_file():
        table = _read_json(path)
        if "records" not in table:
            raise InputError(f"{path}: not a table written by bench/parity_table.py (no 'records')")
        return table["records"], table.get("base")
    raise InputError(f"{path}: no such file or folder")


def merge(inputs: list[tuple[list[dict], dict | None]]) -> tuple[list[dict], dict | None]:
    """Later inputs win for the same (arm, seed, step); the base fills step 0 where an arm lacks it."""
    by_key: dict[tuple[str, int, int], dict] = {}
    base = None
    for records, found_base in inputs:
        base = found_base or base
        for record in records:
            by_key[(record["arm"], record["seed"], record["step"])] = record
    if base is not None:
        for arm, seed in {(a, s) for a, s, _ in by_key}:
            if (arm, seed, 0) not in by_key:
                by_key[(arm, seed, 0)] = {"arm": arm, "seed": seed, "step": 0, "accuracy": base["accuracy"],
                                          "from": base["from"]}
    return sorted(by_key.values(), key=lambda r: (arm_order(r["arm"]), r["seed"], r["step"])), base


def arm_order(arm: str) -> tuple[int, str]:
    return (0 if arm.lower().startswith("trl") else 1, arm)


def summarize(records: list[dict]) -> dict[str, dict[int, dict]]:
    """{arm: {step: {"mean", "sd" (sample sd; None under 2 seeds), "n", "seeds": {seed: accuracy}}}}."""
    grouped: dict[str, dict[int, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for r in records:
        grouped[r["arm"]][r["step"]][r["seed"]] = r["accuracy"]
    out: dict[str, dict[int, dict]] = {}
    for arm in sorted(grouped, key=arm_order):
        out[arm] = {}
        for step in sorted(grouped[arm]):
            values = list(grouped[arm][step].values())
            out[arm][step] = {"mean": statistics.fmean(values),
                              "sd": statistics.stdev(values) if len(values) > 1 else None,
                              "n": len(values), "seeds": dict(sorted(grouped[arm][step].items()))}
    return out


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}"


def markdown(summary: dict[str, dict[int, dict]], records: list[dict], base: dict | None) -> str:
    steps = sorted({step for arm in summary.values() for step in arm})
    head = "| arm | " + " | ".join(f"step {s}" for s in steps) + " |"
    rule = "|---|" + "---|" * len(steps)
    lines = ["Held-out greedy accuracy (%), mean ± sd over seeds (n seeds):", "", head, rule]
    for arm, by_step in summary.items():
        cells = []
        for s in steps:
            cell = by_step.get(s)
            if cell is None:
                cells.append("–")
            elif cell["sd"] is None:
                cells.append(f"{_pct(cell['mean'])} (n={cell['n']})")
            else:
                cells.append(f"{_pct(cell['mean'])} ± {_pct(cell['sd'])} (n={cell['n']})")
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    lines += ["", "Per seed (%; train reward over the steps since the previous evaluation in brackets):", "",
              "| arm | seed | " + " | ".join(f"step {s}" for s in steps) + " | s/step side by side |",
              "|---|---|" + "---|" * (len(steps) + 1)]
    by_arm_seed: dict[tuple[str, int], dict[int, dict]] = defaultdict(dict)
    for r in records:
        by_arm_seed[(r["arm"], r["seed"])][r["step"]] = r
    for (arm, seed), by_step in by_arm_seed.items():
        cells = []
        for s in steps:
            r = by_step.get(s)
            if r is None:
                cells.append("–")
            else:
                reward = f" [{r['train_reward']:.3f}]" if r.get("train_reward") is not None else ""
                cells.append(_pct(r["accuracy"]) + reward)
        pace = next((r["s_per_step"] for r in by_step.values() if r.get("s_per_step") is not None), None)
        pace_text = "–" if pace is None else f"{pace:.2f}"
        lines.append(f"| {arm} | {seed} | " + " | ".join(cells) + f" | {pace_text} |")
    rules = {r["rule"] for r in records if r.get("rule")}
    if base and base["rule"]:
        rules.add(base["rule"])
    rules = sorted(rules)
    if rules:
        lines += ["", "Rule of the `rlfleet eval` reports: " + "; ".join(rules) + "."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("inputs", nargs="+", type=Path,
                   help="result folders, their .tgz, or tables written before")
    p.add_argument("--out", required=True, type=Path, help="writes OUT.json and OUT.md")
    args = p.parse_args(argv)
    try:
        records, base = merge([read_input(path) for path in args.inputs])
    except InputError as exc:
        print(f"parity_table: {exc}", file=sys.stderr)
        return 2
    if not records:
        print(f"parity_table: no results in {', '.join(map(str, args.inputs))}", file=sys.stderr)
        return 1
    summary = summarize(records)
    text = markdown(summary, records, base)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table = {"summary": {arm: {str(step): cell for step, cell in by_step.items()}
                         for arm, by_step in summary.items()},
             "records": records, "base": base}
    args.out.with_suffix(".json").write_text(json.dumps(table, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
