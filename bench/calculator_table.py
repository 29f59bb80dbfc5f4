"""The calculator phase's table (bench/onegpu_session.sh "calculator N"): for each model (base, after SFT
on tool-use traces, after SFT + GRPO with the calculator), held-out accuracy without and with the tool,
tool calls and turns per episode, the share of episodes with a call, tool errors; and for each training
stage its course and speed (SFT: loss, s/step; GRPO: reward, tool use, env latency per turn, s/step).
Reads the `rlfleet eval` reports (with their .samples.jsonl beside them) and the metrics.jsonl files;
prints a compact table and writes the same figures as JSON.

    python bench/calculator_table.py --arm "base, no tool=OUT/calc-base-notool.json" \
        --arm "base, with tool=OUT/calc-base-tool.json" ... --grpo-metrics OUT/metrics-calc-grpo.jsonl \
        --sft-metrics OUT/metrics-calc-sft.jsonl --out OUT/calculator-summary.json
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def _lines(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _mean(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return sum(values) / len(values) if values else None


def eval_row(path: Path) -> dict:
    """One arm's figures; an arm whose report is missing (its command failed or ran out of time) is empty."""
    if not path.is_file():
        return {"accuracy": None, "prompts": 0, "missing": str(path)}
    report = json.loads(path.read_text())
    overall = report["overall"]
    samples = _lines(path.with_name(path.name.removesuffix(".json") + ".samples.jsonl"))
    with_call = (sum(1 for s in samples if s.get("tool_calls")) / len(samples)
                 if samples and any("tool_calls" in s for s in samples) else None)
    return {"accuracy": overall["accuracy"], "prompts": overall["prompts"],
            "tool_calls_per_episode": overall.get("tool_calls_mean"),
            "episodes_with_a_call": with_call if overall.get("turns_mean") is not None else None,
            "turns_per_episode": overall.get("turns_mean"),
            "tool_errors": overall.get("tool_errors"), "response_length": overall["response_length_mean"],
            "seconds": report.get("seconds")}


def grpo_course(path: Path) -> dict:
    lines = _lines(path)
    if not lines:
        return {"steps": 0}
    head, tail = lines[:5], lines[-5:]
    step_s = [r["timing/step_s"] for r in lines if "timing/step_s" in r]
    return {"steps": lines[-1]["step"],
            "reward_first5": _mean(head, "reward/mean"), "reward_last5": _mean(tail, "reward/mean"),
            "tool_calls_per_episode_first5": _mean(head, "env/tool_calls_per_episode"),
            "tool_calls_per_episode_last5": _mean(tail, "env/tool_calls_per_episode"),
            "tool_errors_per_step_first5": _mean(head, "env/tool_errors"),
            "tool_errors_per_step_last5": _mean(tail, "env/tool_errors"),
            "turns_per_episode_last5": _mean(tail, "env/turns_mean"),
            "cut_at_token_budget_last5": _mean(tail, "env/finish/length"),
            "cut_at_max_turns_last5": _mean(tail, "env/finish/max_turns"),
            "env_failed_total": sum(r.get("env/failed", 0) for r in lines),
            "env_latency_s_mean": _mean(lines, "env/latency_s_mean"),
            "step_s_median": statistics.median(step_s) if step_s else None}


def sft_course(path: Path) -> dict:
    lines = [r for r in _lines(path) if "sft/loss" in r]
    if not lines:
        return {"steps": 0}
    step_s = [r["timing/train_s"] for r in lines if "timing/train_s" in r]
    return {"steps": lines[-1]["step"], "loss_first": lines[0]["sft/loss"],
            "loss_last": lines[-1]["sft/loss"],
            "step_s_median": statistics.median(step_s) if step_s else None}


def _cell(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def format_table(rows: dict[str, dict], sft: dict, grpo: dict) -> str:
    out = [f"{'':22}{'accuracy':>10}{'tools/ep':>10}{'w/ call':>9}{'turns/ep':>10}{'tool err':>10}"
           f"{'length':>9}{'prompts':>9}"]
    for arm, r in rows.items():
        cells = [_cell(r["accuracy"]), _cell(r.get("tool_calls_per_episode"), 2),
                 _cell(r.get("episodes_with_a_call"), 2), _cell(r.get("turns_per_episode"), 2),
                 _cell(r.get("tool_errors")), _cell(r.get("response_length"), 1), str(r["prompts"])]
        widths = (10, 10, 9, 10, 10, 9, 9)
        out.append(f"{arm:22}" + "".join(f"{c:>{w}}" for c, w in zip(cells, widths)))
    g = grpo
    out.append(f"sft: {sft['steps']} steps; loss {_cell(sft.get('loss_first'))} -> "
               f"{_cell(sft.get('loss_last'))}; median step {_cell(sft.get('step_s_median'), 2)} s")
    out.append(f"grpo: {g['steps']} steps; reward {_cell(g.get('reward_first5'))} (first 5) -> "
               f"{_cell(g.get('reward_last5'))} (last 5); tool calls/episode "
               f"{_cell(g.get('tool_calls_per_episode_first5'), 2)} -> "
               f"{_cell(g.get('tool_calls_per_episode_last5'), 2)}; tool errors/step "
               f"{_cell(g.get('tool_errors_per_step_first5'), 1)} -> "
               f"{_cell(g.get('tool_errors_per_step_last5'), 1)}; cut per step (budget, turns) "
               f"{_cell(g.get('cut_at_token_budget_last5'), 1)}, "
               f"{_cell(g.get('cut_at_max_turns_last5'), 1)}; "
               f"env failed {g.get('env_failed_total')}; median step {_cell(g.get('step_s_median'), 2)} s; "
               f"env latency/turn {_cell(g.get('env_latency_s_mean'), 4)} s")
    return "\n".join(out)


def _arm(text: str) -> tuple[str, Path]:
    label, sep, path = text.partition("=")
    if not sep or not label or not path:
        raise argparse.ArgumentTypeError(f"--arm {text!r}: expected LABEL=REPORT.json")
    return label, Path(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arm", action="append", type=_arm, required=True, metavar="LABEL=REPORT",
                        help="an rlfleet eval report and its row's label, in the table's order; repeat")
    parser.add_argument("--grpo-metrics", type=Path, required=True, help="the GRPO run's metrics.jsonl")
    parser.add_argument("--sft-metrics", type=Path, default=None, help="the SFT's metrics.jsonl")
    parser.add_argument("--out", type=Path, required=True, help="the summary JSON to write")
    args = parser.parse_args(argv)
    rows = {label: eval_row(path) for label, path in args.arm}
    grpo = grpo_course(args.grpo_metrics)
    sft = sft_course(args.sft_metrics) if args.sft_metrics else {"steps": 0}
    print(format_table(rows, sft, grpo))
    args.out.write_text(json.dumps({"evals": rows, "sft": sft, "training": grpo}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
