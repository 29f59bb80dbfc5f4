"""`rlfleet plot RUN_DIR`: the main curves of a run from its metrics.jsonl, as one PNG.

Panels: reward (mean with a +-std band) with validation accuracy against its majority-answer
baseline, policy loss, KL, staleness, throughput, response length, entropy, answer collapse (the
share of the most common answer, clipped responses) and, for multi-turn runs, turns, tool calls and
tool errors per episode. A panel whose metrics the run never logged says so instead of disappearing.
`panels` decides what is drawn (pure, tested); `plot_run` only draws it.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlfleet.errors import DataError

# (title, [(metric, label)]) for the panels drawn as plain lines.
PANELS = [
    ("policy loss", [("actor/pg_loss", "pg_loss")]),
    (
        "KL (and rollout-learner logprob diff)",
        [("actor/kl_loss", "kl_loss"), ("rollout/logprob_diff_mean", "rollout logprob diff")],
    ),
    ("staleness (versions)", [("staleness/mean", "mean"), ("staleness/max", "max")]),
    ("throughput", [("perf/tokens_per_s", "tokens/s")]),
    ("response length (tokens)", [("response_length/mean", "train mean"),
                                  ("val/response_length/mean", "validation mean")]),
    ("entropy (nats/token)", [("actor/entropy", "train entropy"),
                              ("val/nll/mean", "validation NLL of own tokens")]),
]


@dataclass
class Curve:
    label: str
    xs: list[float]
    ys: list[float]
    style: str = "-"  # a matplotlib line style: "-" train, "--" validation, ":" a baseline
    color: str | None = None
    band: list[float] | None = None  # +- this around ys


@dataclass
class Panel:
    title: str
    curves: list[Curve] = field(default_factory=list)
    ylim: tuple[float, float] | None = None  # fixed for shares, so a flat line near 0 reads as small


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plot", help="draw a run's main curves (reward and accuracy vs baseline, loss, KL, length, entropy, "
        "collapse, tools) to a PNG"
    )
    p.add_argument("run_dir", help="the run folder (<output_dir>/<name>) holding metrics.jsonl")
    p.add_argument("--output", "-o", help="PNG to write (default: RUN_DIR/curves.png)")


def read_metrics(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise DataError(f"{path} does not exist: is {path.parent} a run folder?")
    lines = []
    for line_no, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path} line {line_no} is not valid JSON: {exc.msg}") from None
        if not isinstance(record, dict) or "step" not in record:
            raise DataError(f"{path} line {line_no} has no 'step'")
        lines.append(record)
    if not lines:
        raise DataError(f"{path} has no metrics yet")
    return lines


def series(lines: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of the lines that hold a finite number for `key`."""
    xs, ys = [], []
    for m in lines:
        v = m.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            xs.append(float(m["step"]))
            ys.append(float(v))
    return xs, ys


def _val_prefixes(lines: list[dict[str, Any]], suffix: str) -> list[str]:
    """`val` and each `val/<data_source>` that logged `<prefix>/<suffix>`, overall first."""
    keys = {k[: -len(suffix) - 1] for m in lines for k in m
            if k.startswith("val") and k.endswith("/" + suffix)}
    return sorted(keys, key=lambda k: (k != "val", k))


def _reward_panel(lines: list[dict[str, Any]]) -> Panel:
    panel = Panel("reward / validation accuracy vs majority-answer baseline")
    xs, mean = series(lines, "reward/mean")
    if xs:
        std_by_step = dict(zip(*series(lines, "reward/std")))
        panel.curves.append(Curve("train reward", xs, mean, color="tab:blue",
                                  band=[std_by_step.get(x, 0.0) for x in xs]))
    colors = iter(["tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive"])
    for prefix in _val_prefixes(lines, "accuracy"):
        color = next(colors, None)
        panel.curves.append(Curve(f"{prefix}/accuracy", *series(lines, f"{prefix}/accuracy"), "--", color))
        bx, by = series(lines, f"{prefix}/majority_baseline")
        if bx:
            panel.curves.append(Curve(f"{prefix} baseline", bx, by, ":", color))
    return panel


def _collapse_panel(lines: list[dict[str, Any]]) -> Panel:
    panel = Panel("answer collapse and clipping (share)", ylim=(-0.02, 1.02))
    for prefix in _val_prefixes(lines, "answers/top_share"):
        xs, ys = series(lines, f"{prefix}/answers/top_share")
        panel.curves.append(Curve(f"{prefix} most common answer", xs, ys, "--"))
    for key, label, style in (("response_length/clip_ratio", "train clipped", "-"),
                              ("val/response_length/clip_ratio", "validation clipped", "--")):
        xs, ys = series(lines, key)
        if xs:
            panel.curves.append(Curve(label, xs, ys, style))
    return panel


def _ratio(lines: list[dict[str, Any]], num: str, den: str) -> tuple[list[float], list[float]]:
    """num / den on the lines holding both with den > 0."""
    xs, ys = [], []
    for m in lines:
        n, d = m.get(num), m.get(den)
        if isinstance(n, (int, float)) and isinstance(d, (int, float)) and d > 0:
            xs.append(float(m["step"]))
            ys.append(float(n) / float(d))
    return xs, ys


def _episodes_panel(lines: list[dict[str, Any]]) -> Panel:
    panel = Panel("multi-turn: per episode")
    for label, (xs, ys), style in (
        ("turns", series(lines, "env/turns_mean"), "-"),
        ("tool calls", series(lines, "env/tool_calls_per_episode"), "-"),
        ("tool errors", _ratio(lines, "env/tool_errors", "env/episodes"), "-"),
        ("validation turns", series(lines, "val/turns/mean"), "--"),
        ("validation tool calls", series(lines, "val/tool_calls/mean"), "--"),
    ):
        if xs:
            panel.curves.append(Curve(label, xs, ys, style))
    return panel


def panels(lines: list[dict[str, Any]]) -> list[Panel]:
    """What each of the nine panels draws, in order."""
    out = [_reward_panel(lines)]
    for title, keys in PANELS:
        panel = Panel(title)
        for key, label in keys:
            xs, ys = series(lines, key)
            if xs:
                panel.curves.append(Curve(label, xs, ys, "--" if key.startswith("val") else "-"))
        out.append(panel)
    return [*out, _collapse_panel(lines), _episodes_panel(lines)]


def _draw(ax, panel: Panel) -> None:
    for c in panel.curves:
        marker = "o" if c.style != "-" and len(c.xs) < 30 else None
        ax.plot(c.xs, c.ys, linestyle=c.style, marker=marker, markersize=3, color=c.color, label=c.label)
        if c.band is not None:
            low = [y - b for y, b in zip(c.ys, c.band)]
            high = [y + b for y, b in zip(c.ys, c.band)]
            ax.fill_between(c.xs, low, high, color=c.color, alpha=0.15)
    if panel.ylim is not None:
        ax.set_ylim(*panel.ylim)
    _finish(ax, panel.title, bool(panel.curves))


def _finish(ax, title: str, has_data: bool) -> None:
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    if has_data:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="gray")


def plot_run(run_dir: str | Path, output: str | Path | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    lines = read_metrics(run_dir / "metrics.jsonl")
    output = Path(output) if output else run_dir / "curves.png"
    fig, axes = plt.subplots(3, 3, figsize=(15, 11))
    try:
        for ax, panel in zip(axes.flat, panels(lines)):
            _draw(ax, panel)
        fig.suptitle(f"{run_dir.name}: {len(lines)} metric lines, last step {lines[-1]['step']}")
        fig.tight_layout()
        output.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(output, dpi=80)
    finally:
        plt.close(fig)
    return output


def run(args: argparse.Namespace) -> int:
    print(plot_run(args.run_dir, args.output))
    return 0
