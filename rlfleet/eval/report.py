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


def _percent(share: float) -> str:
    return f"{100 * share:.0f}%"


def collapse_notes(summary: dict[str, Any]) -> list[str]:
    """A line per data_source whose answers concentrate on one more than its ground truths do (the
    policy collapsing), or whose accuracy does not beat always giving the most frequent ground truth."""
    notes = []
    for name, s in summary["by_source"].items():
        top, baseline, accuracy = s.get("top_answer_share"), s.get("majority_baseline"), s.get("accuracy")
        if top is not None and baseline is not None and top >= 0.5 and top > baseline and s["samples"] > 1:
            same = " (the most frequent ground truth)" if s["top_answer"] == s.get("majority_answer") else ""
            notes.append(f"note: {name}: {_percent(top)} of answers are {s['top_answer']!r}{same}")
        if accuracy and baseline is not None and accuracy <= baseline:
            notes.append(
                f"note: {name}: accuracy {_percent(accuracy)} is not above the majority-answer baseline "
                f"{_percent(baseline)} (always answering {s.get('majority_answer')!r})"
            )
    return notes


def format_table(summary: dict[str, Any]) -> str:
    """One row per data_source and one for all of them: prompts, samples, accuracy, the majority-answer
    baseline, pass@k, mean reward, mean response length (tokens), the share of clipped responses (hit
    max_new_tokens), reward failures, distinct answers and the share of the most common one, the mean
    negative log-prob per token when known, with episodes the mean turns and tool calls per episode,
    and the reward rule a data_source was scored by when the summary names it (accuracies under
    different rules are not comparable). Then the lines of `collapse_notes`."""
    ks = summary["ks"]
    names = [*summary["by_source"], "all"]
    first = max(len("data_source"), *(len(n) for n in names))
    episodes = "turns_mean" in summary["overall"]
    nll = summary["overall"].get("nll_mean") is not None
    cols = ["prompts", "samples", "accuracy", "baseline", *(f"pass@{k}" for k in ks), "reward", "length",
            "clipped", "failed", "distinct", "top"]
    if nll:
        cols.append("nll")
    if episodes:
        cols += ["turns", "tools"]
    lines = ["data_source".ljust(first) + "".join(c.rjust(10) for c in cols)]
    if any(s.get("rule") for s in summary["by_source"].values()):
        lines[0] += "  rule"
    rows = [*summary["by_source"].items(), ("all", summary["overall"])]
    for name, s in rows:
        values = [s["prompts"], s["samples"], s["accuracy"], s.get("majority_baseline"),
                  *(s[f"pass@{k}"] for k in ks), s["reward_mean"]]
        lines.append(
            name.ljust(first)
            + "".join(_cell(v, 10) for v in values)
            + _cell(s["response_length_mean"], 10, 1)
            + _cell(s.get("clipped"), 10, 2)
            + _cell(s["reward_failed"], 10)
            + _cell(s.get("answers_distinct"), 10)
            + _cell(s.get("top_answer_share"), 10, 2)
            + (_cell(s.get("nll_mean"), 10, 3) if nll else "")
            + (_cell(s.get("turns_mean"), 10, 2) + _cell(s.get("tool_calls_mean"), 10, 2) if episodes else "")
            + (f"  {s['rule']}" if s.get("rule") else "")
        )
    return "\n".join([*lines, *collapse_notes(summary)])


def sample_texts(samples: list[EvalSample], per_source: int = 3, max_chars: int = 1500) -> dict[str, str]:
    """A few samples per data_source as Markdown (TensorBoard's text tab), keyed `<data_source>`: the
    first `per_source` prompts' first samples, so each evaluation shows the same prompts."""
    out: dict[str, list[str]] = {}
    for s in samples:
        if s.sample != 0 or len(out.setdefault(s.data_source, [])) >= per_source:
            continue
        reward = "failed" if s.reward is None else f"{s.reward:.3f}"
        tools = f" · {s.turns} turns, {s.tool_calls} tool calls ({s.tool_errors} failed)" if s.turns else ""
        out[s.data_source].append(
            f"**prompt {s.prompt_index}** · reward {reward} · answer `{s.answer}` · ground truth "
            f"`{s.ground_truth}` · {s.length} tokens, finish {s.finish_reason}{tools}\n\n"
            + "".join(f"    {line}\n" for line in s.response[-max_chars:].splitlines())
        )
    return {src: "\n\n".join(texts) for src, texts in out.items()}


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
