"""The calculator phase's table (bench/onegpu_session.sh "calculator N"): held-out accuracy and tool
use of the base and the trained model, each evaluated with and without the calculator, and the
training run's course. Reads the four `rlfleet eval` reports and the run's metrics.jsonl; prints a
compact table and writes the same figures as JSON.

    python bench/calculator_table.py --evals OUT/calc-base-notool.json OUT/calc-base-tool.json \
        OUT/calc-trained-notool.json OUT/calc-trained-tool.json --metrics OUT/metrics-calc.jsonl \
        --out OUT/calculator-summary.json
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

ARMS = ("base, no tool", "base, with tool", "trained, no tool", "trained, with tool")


def eval_row(path: Path) -> dict:
    report = json.loads(path.read_text())
    overall = report["overall"]
    return {"accuracy": overall["accuracy"], "prompts": overall["prompts"],
            "tool_calls_per_episode": overall.get("tool_calls_mean"),
            "turns_per_episode": overall.get("turns_mean"),
            "tool_errors": overall.get("tool_errors"), "response_length": overall["response_length_mean"],
            "seconds": report.get("seconds")}


def training(metrics_path: Path) -> dict:
    lines = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    if not lines:
        return {"steps": 0}
    head, tail = lines[:5], lines[-5:]

    def mean(rows: list[dict], key: str) -> float | None:
        values = [r[key] for r in rows if r.get(key) is not None]
        return sum(values) / len(values) if values else None

    return {"steps": lines[-1]["step"],
            "reward_first5": mean(head, "reward/mean"), "reward_last5": mean(tail, "reward/mean"),
            "tool_calls_per_episode_first5": mean(head, "env/tool_calls_per_episode"),
            "tool_calls_per_episode_last5": mean(tail, "env/tool_calls_per_episode"),
            "tool_errors_per_step_first5": mean(head, "env/tool_errors"),
            "tool_errors_per_step_last5": mean(tail, "env/tool_errors"),
            "turns_per_episode_last5": mean(tail, "env/turns_mean"),
            "env_failed_total": sum(r.get("env/failed", 0) for r in lines),
            "env_latency_s_mean": mean(lines, "env/latency_s_mean"),
            "step_s_median": statistics.median(r["timing/step_s"] for r in lines if "timing/step_s" in r)
            if any("timing/step_s" in r for r in lines) else None}


def _cell(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def format_table(rows: dict[str, dict], train: dict) -> str:
    out = [f"{'':20}{'accuracy':>10}{'tools/ep':>10}{'turns/ep':>10}{'tool err':>10}{'length':>9}"
           f"{'prompts':>9}"]
    for arm, r in rows.items():
        out.append(f"{arm:20}{_cell(r['accuracy']):>10}{_cell(r['tool_calls_per_episode'], 2):>10}"
                   f"{_cell(r['turns_per_episode'], 2):>10}{_cell(r['tool_errors']):>10}"
                   f"{_cell(r['response_length'], 1):>9}{r['prompts']:>9}")
    out.append(f"training: {train['steps']} steps; reward {_cell(train.get('reward_first5'))} (first 5) -> "
               f"{_cell(train.get('reward_last5'))} (last 5); tool calls/episode "
               f"{_cell(train.get('tool_calls_per_episode_first5'), 2)} -> "
               f"{_cell(train.get('tool_calls_per_episode_last5'), 2)}; tool errors/step "
               f"{_cell(train.get('tool_errors_per_step_first5'), 1)} -> "
               f"{_cell(train.get('tool_errors_per_step_last5'), 1)}; "
               f"env failed {train.get('env_failed_total')}; "
               f"median step {_cell(train.get('step_s_median'), 2)} s; env latency/turn "
               f"{_cell(train.get('env_latency_s_mean'), 4)} s")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--evals", nargs=4, type=Path, required=True, metavar="REPORT",
                        help="the rlfleet eval reports, in the order: " + "; ".join(ARMS))
    parser.add_argument("--metrics", type=Path, required=True, help="the training run's metrics.jsonl")
    parser.add_argument("--out", type=Path, required=True, help="the summary JSON to write")
    args = parser.parse_args(argv)
    rows = {arm: eval_row(path) for arm, path in zip(ARMS, args.evals)}
    train = training(args.metrics)
    print(format_table(rows, train))
    args.out.write_text(json.dumps({"evals": rows, "training": train}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
