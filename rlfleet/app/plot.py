"""`rlfleet plot RUN_DIR`: the main curves of a run from its metrics.jsonl, as one PNG.

Panels: reward (mean with a +-std band, and validation accuracy when the run
has any), policy loss, KL, staleness, throughput, response length. A panel
whose metrics the run never logged says so instead of disappearing.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from rlfleet.errors import DataError

# (title, [(metric, label)]) for each panel after the reward one.
PANELS = [
    ("policy loss", [("actor/pg_loss", "pg_loss")]),
    (
        "KL (and rollout-learner logprob diff)",
        [("actor/kl_loss", "kl_loss"), ("rollout/logprob_diff_mean", "rollout logprob diff")],
    ),
    ("staleness (versions)", [("staleness/mean", "mean"), ("staleness/max", "max")]),
    ("throughput", [("perf/tokens_per_s", "tokens/s")]),
    ("response length (tokens)", [("response_length/mean", "mean")]),
]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plot", help="draw a run's main curves (reward, loss, KL, staleness, throughput) to a PNG"
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


def _reward_panel(ax, lines: list[dict[str, Any]]) -> None:
    xs, mean = series(lines, "reward/mean")
    std_by_step = dict(zip(*series(lines, "reward/std")))
    if xs:
        ax.plot(xs, mean, label="train reward", color="tab:blue")
        std = [std_by_step.get(x, 0.0) for x in xs]
        ax.fill_between(
            xs,
            [m - s for m, s in zip(mean, std)],
            [m + s for m, s in zip(mean, std)],
            color="tab:blue",
            alpha=0.15,
        )
    val_keys = sorted({k for m in lines for k in m if k.startswith("val/") and k.endswith("/accuracy")})
    for key in val_keys:
        vx, vy = series(lines, key)
        ax.plot(vx, vy, marker="o", linestyle="--", label=key)
    _finish(ax, "reward / validation accuracy", bool(xs or val_keys))


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
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    try:
        _reward_panel(axes[0][0], lines)
        for ax, (title, keys) in zip(axes.flat[1:], PANELS):
            drawn = False
            for key, label in keys:
                xs, ys = series(lines, key)
                if xs:
                    ax.plot(xs, ys, label=label)
                    drawn = True
            _finish(ax, title, drawn)
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
