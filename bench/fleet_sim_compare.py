"""Before against after: two folders of bench/fleet_sim.py runs (OUT/<case>/result.json each), paired by
replica count, as one PNG of bars and one JSON (the results without the memory samples).

    python bench/fleet_sim_compare.py /tmp/pair/b /tmp/pair/a bench/results/fleet_sim_issue44_pair
writes PREFIX.png and PREFIX.json and prints the figures as a markdown table.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

# (result key, label, the target or None)
PANELS = [
    ("fraction_of_ideal", "groups/s ÷ ideal (window)", 0.95),
    ("fraction_of_ideal_outside_pause", "groups/s ÷ ideal, learner pause out", 0.95),
    ("controller_cpu_ms_per_group", "controller CPU ms / group", 1.0),
    ("admission_ms_p99_outside_pause", "p99 free slot → next Generate, ms (pause out)", 50.0),
    ("controller_admission_ms_p99", "p99 of it less the gate's hold, ms", 50.0),
    ("train_call_beyond_modelled_s_p50", "Train call beyond modelled, s (p50)", 2.0),
]
TABLE = ["replicas", "data_plane", "steps_in_window", *(k for k, _, _ in PANELS), "requeued", "lost",
         "trained_twice", "stranded", "reform_s_max", "load_avg"]


def load(folder: Path) -> dict[int, dict]:
    runs = [json.loads(p.read_text()) for p in sorted(folder.glob("*/result.json"))]
    return {r["replicas"]: {k: v for k, v in r.items() if k != "rss_mb"} for r in runs}


def number(value) -> float:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def cell(value) -> str:
    if isinstance(value, float):
        return "–" if math.isnan(value) else f"{value:.3g}"
    if isinstance(value, list) and value and isinstance(value[0], float):
        return "/".join(f"{v:.1f}" for v in value)
    return str(value) if value not in ({}, []) else "0"


def main() -> None:
    before, after, prefix = load(Path(sys.argv[1])), load(Path(sys.argv[2])), sys.argv[3]
    sizes = sorted(set(before) | set(after))
    Path(prefix + ".json").write_text(json.dumps({"before": before, "after": after}, indent=1))
    print("| N | run | " + " | ".join(TABLE[1:]) + " |")
    print("|" + "---|" * (len(TABLE) + 1))
    for n in sizes:
        for name, runs in (("before", before), ("after", after)):
            if n in runs:
                print(f"| {n} | {name} | " + " | ".join(cell(runs[n].get(k)) for k in TABLE[1:]) + " |")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    width = 0.38
    for ax, (key, title, target) in zip(axes.flat, PANELS):
        xs = range(len(sizes))
        ax.bar([x - width / 2 for x in xs], [number(before.get(n, {}).get(key)) for n in sizes], width,
               label="before")
        ax.bar([x + width / 2 for x in xs], [number(after.get(n, {}).get(key)) for n in sizes], width,
               label="after")
        if target is not None:
            ax.axhline(target, color="k", linestyle="--", linewidth=1, label="issue 44's target")
        ax.set_xticks(list(xs), [f"N={n}" for n in sizes])
        ax.set_title(title, fontsize=10)
        if "ms" in key:
            ax.set_yscale("log")
    axes.flat[0].legend(fontsize=8)
    fig.suptitle("bench/fleet_sim.py, S=1 with churn: before against after (" + Path(prefix).name + ")")
    fig.tight_layout()
    fig.savefig(prefix + ".png", dpi=90)


if __name__ == "__main__":
    main()
