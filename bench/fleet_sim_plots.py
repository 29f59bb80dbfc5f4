"""Plots of bench/fleet_sim.py's results: reads OUT/*/result.json, writes PNGs.

    python bench/fleet_sim_plots.py /tmp/fleet_runs bench/results/fleet_sim_2026-12-02
    python bench/fleet_sim_plots.py --table /tmp/fleet_runs     (the figures as a markdown table)
The first writes PREFIX_scaling.png (throughput against ideal, controller CPU per group, admission latency,
replica idle, controller memory against N, one line per staleness), PREFIX_staleness.png and
PREFIX.json (the results, without the memory samples).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def load(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*/result.json"))]


def main() -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder, prefix = Path(sys.argv[1]), sys.argv[2]
    results = load(folder)
    steady = [r for r in results if kind(r) == "steady"]
    stalenesses = sorted({r["staleness"] for r in steady})
    for r in results:
        r["of_ideal"] = of_ideal(r)
    panels = [("of_ideal", "groups/s ÷ fleet's ideal", 0.95),
              ("controller_cpu_ms_per_group", "controller CPU ms per group", None),
              ("to_buffer_ms_p99", "p99 completion → buffered (ms)", 50.0),
              ("to_buffer_ms_p50", "p50 completion → buffered (ms)", None),
              ("idle_mean", "replica idle fraction", 0.05),
              ("controller_rss_mb_max", "controller RSS (MB)", None)]
    fig, axes = plt.subplots(2, 3, figsize=(14, 8))
    for ax, (key, title, target) in zip(axes.flat, panels):
        for s in stalenesses:
            rows = sorted((r for r in steady if r["staleness"] == s), key=lambda r: r["replicas"])
            ax.plot([r["replicas"] for r in rows], [r[key] for r in rows], marker="o", label=f"S={s}")
        for r in results:
            if kind(r) != "steady":
                ax.scatter([r["replicas"]], [r[key]], marker="x" if r["churn"] else "+", color="black",
                           zorder=5)
        if key.startswith("to_buffer"):
            ax.set_yscale("log")
        if target is not None:
            ax.axhline(target, linestyle="--", color="grey", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("replicas N")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes.flat[0].legend(title="steady (x: churn, +: watch)")
    fig.suptitle("rlfleet controller against simulated H200 replicas (bench/fleet_sim.py, 2-core machine)")
    fig.tight_layout()
    fig.savefig(f"{prefix}_scaling.png", dpi=90)

    fig, axes = plt.subplots(1, len(results), figsize=(2.2 * len(results), 2.6), sharey=True, squeeze=False)
    for ax, r in zip(axes[0], sorted(results, key=lambda r: (kind(r), r["replicas"], r["staleness"]))):
        hist = {int(k): v for k, v in r["staleness_hist"].items()}
        total = sum(hist.values()) or 1
        ax.bar(list(hist), [v / total for v in hist.values()])
        ax.axvline(r["staleness_bound"] + 0.5, color="red", linestyle="--", linewidth=1)
        ax.set_title(f"N={r['replicas']} S={r['staleness']} {kind(r)}", fontsize=8)
        ax.set_xlabel("trained version − generated", fontsize=7)
    fig.tight_layout()
    fig.savefig(f"{prefix}_staleness.png", dpi=90)
    raw = [{k: v for k, v in r.items() if k not in ("rss_mb", "of_ideal")} for r in results]
    Path(f"{prefix}.json").write_text(json.dumps(raw, indent=1))


def kind(r: dict) -> str:
    """steady, churn, watch (replicas run the membership watch) or churn+watch"""
    return "+".join(k for k in ("churn", "watch") if r.get(k)) or "steady"


def of_ideal(r: dict) -> float:
    """Trained groups/s over whole steps against the ideal where the window held 3 steps or more (the
    scored rate comes in waves of a batch: ± a wave at the window's edges), else the scored rate."""
    rate = r["trained_groups_per_s"] if r["steps_in_window"] >= 3 else r["groups_per_s"]
    return rate / r["ideal_groups_per_s"]


def table(results: list[dict]) -> str:
    """The figures as a markdown table, one row per run (steady runs by N and S, then churn)."""
    head = ("| N | S | run | K | scored/s (ideal) | trained/s | of ideal | controller CPU ms/group (share) "
            "| completion → buffered p50 / p99 ms | → Train p50 / p99 s | idle | staleness | RSS MB "
            "| weight sync p50 s | lost / twice |")
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in sorted(results, key=lambda r: (kind(r), r["replicas"], r["staleness"])):
        hist = " ".join(f"{k}:{v}" for k, v in r["staleness_hist"].items())
        rows.append(
            f"| {r['replicas']} | {r['staleness']} | {kind(r)} | {r['slowdown']:.1f} "
            f"| {r['groups_per_s']:.1f} ({r['ideal_groups_per_s']:.1f}) | {r['trained_groups_per_s']:.1f} "
            f"| {of_ideal(r):.0%} | {r['controller_cpu_ms_per_group']:.2f} "
            f"({r['controller_cpu_share']:.0%}) | {r['to_buffer_ms_p50']:.0f} / {r['to_buffer_ms_p99']:.0f} "
            f"| {r['to_batch_ms_p50'] / 1000:.1f} / {r['to_batch_ms_p99'] / 1000:.1f} | {r['idle_mean']:.1%} "
            f"| {hist} (≤ {r['staleness_bound']}) | {r['controller_rss_mb_max']:.0f} "
            f"| {r['weight_sync_s_p50']:.2f} | {len(r['lost'])} / {len(r['trained_twice'])} |")
    return "\n".join(rows)


if __name__ == "__main__":
    if sys.argv[1] == "--table":
        print(table(load(Path(sys.argv[2]))))
    else:
        main()
