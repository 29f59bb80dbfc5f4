"""The evaluation report: a JSON file, a JSONL of samples beside it, and a table for the terminal."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from rlfleet.eval.scoring import EvalSample


def _cell(value: Any, width: int, digits: int = 4) -> str:
    if value is None:
        text = "-"
    elif isinstance(value, float):
        text = f"{value:.{digits}f}"
    else:
        text = str(value)
    return text.rjust(width)


def format_table(summary: dict[str, Any]) -> str:
    """One row per data_source and one for all of them: prompts, samples, accuracy, pass@k,
    mean reward, mean response length (tokens), reward failures, with episodes the mean turns and
    tool calls per episode, and the reward rule a data_source was scored by when the summary names
    it (accuracies under different rules are not comparable)."""
    ks = summary["ks"]
    names = [*summary["by_source"], "all"]
    first = max(len("data_source"), *(len(n) for n in names))
    episodes = "turns_mean" in summary["overall"]
    cols = ["prompts", "samples", "accuracy", *(f"pass@{k}" for k in ks), "reward", "length", "failed"]
    if episodes:
        cols += ["turns", "tools"]
    lines = ["data_source".ljust(first) + "".join(c.rjust(10) for c in cols)]
    if any(s.get("rule") for s in summary["by_source"].values()):
        lines[0] += "  rule"
    rows = [*summary["by_source"].items(), ("all", summary["overall"])]
    for name, s in rows:
        values = [s["prompts"], s["samples"], s["accuracy"], *(s[f"pass@{k}"] for k in ks), s["reward_mean"]]
        lines.append(
            name.ljust(first)
            + "".join(_cell(v, 10) for v in values)
            + _cell(s["response_length_mean"], 10, 1)
            + _cell(s["reward_failed"], 10)
            + (_cell(s.get("turns_mean"), 10, 2) + _cell(s.get("tool_calls_mean"), 10, 2) if episodes else "")
            + (f"  {s['rule']}" if s.get("rule") else "")
        )
    return "\n".join(lines)


def write_report(
    path: str | Path, summary: dict[str, Any], samples: list[EvalSample], meta: dict[str, Any]
) -> tuple[Path, Path]:
    """Writes `path` (JSON: meta + summary) and `<path stem>.samples.jsonl`; returns both paths."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    samples_path = path.with_name(f"{path.stem}.samples.jsonl")
    with open(samples_path, "w") as f:
        f.writelines(
            json.dumps({**dataclasses.asdict(s), "correct": s.correct(summary["correct_at"])}) + "\n"
            for s in samples
        )
    path.write_text(json.dumps({**meta, **summary, "samples_file": samples_path.name}, indent=2) + "\n")
    return path, samples_path
