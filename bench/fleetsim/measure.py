"""What a simulator run measured, from its files: the controller's journal, the learner's step log,
the replica hosts' engine logs and the controller's CPU and memory samples (bench/fleet_sim.py).

    python -m bench.fleetsim.measure OUT/CASE   (analyses a finished run again, rewrites result.json)
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from controller.journal import audit, read_journal


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def outside_seconds(start: float, end: float, pause: tuple[float, float] | None) -> float:
    """Seconds of [start, end] outside the pause window (all of them without a pause)."""
    return end - start - (_overlap(start, end, *pause) if pause else 0.0)


def analyse(out: Path, run_dir: Path, window: tuple[float, float], cpu: tuple[float, float],
            rss_mb: list[float], ideal_per_replica: float, staleness: int,
            samples_per_group: int = 16, pause: tuple[float, float] | None = None) -> dict:
    """`pause`: when the churn run's learner was paused (wall clock); admission is also given
    without the slots freed in it, which wait for the pause by design (the staleness gate)."""
    t0, t1 = window
    events = read_journal(run_dir / "journal" / "prompts.jsonl")
    trained = [e for e in events if e["event"] == "trained"]
    scored = {e["seq"]: e["t"] for e in events if e["event"] == "scored"}
    received = {e["seq"]: e["t"] for e in events if e["event"] == "generated"}
    in_window = [e for e in trained if t0 <= e["t"] <= t1]
    steps = [json.loads(line) for line in (out / "learner.jsonl").read_text().splitlines() if line]
    arrived = {s["step"]: s["arrived"] for s in steps}
    hosts = [json.loads(p.read_text()) for p in sorted(out.glob("host-*.json"))]
    replicas = [r for h in hosts for r in h["replicas"]]
    sent: dict[int, float] = {}
    lag = []
    for r in replicas:
        for seq, due, when, _version in r["sent"]:
            sent[seq] = when
            lag.append(when - due)
    to_buffer = [scored[s] - sent[s] for s in sent if s in scored and t0 <= sent[s] <= t1]
    # the two stages of to_buffer: the stream into the controller, then waiting for and getting rewards
    to_controller = [received[s] - sent[s] for s in sent if s in received and t0 <= sent[s] <= t1]
    to_scored = [scored[s] - received[s] for s in sent
                 if s in scored and s in received and t0 <= sent[s] <= t1]
    to_batch = [arrived[e["step"]] - sent[e["seq"]] for e in in_window
                if e["step"] in arrived and e["seq"] in sent]
    # Admission: a replica's free slot (its Generate stream ended) to its next prompt dispatched (the
    # next Generate reaching its engine), whatever held it: the staleness gate, the controller's threads.
    gaps = [(a[1], b[0]) for r in replicas
            for a, b in zip(sorted(r["busy"]), sorted(r["busy"])[1:]) if t0 <= a[1] <= t1]
    admission = [b - a for a, b in gaps]
    # The controller's own part of it: the gap less the time its gate held the slot back (up to the
    # hand-out that let it through: controller/admission.py), i.e. a free slot the gate allows to fill,
    # to the prompt dispatched to it.
    own = controller_admission(replicas, events, t0, t1)
    p0, p1 = pause or (0.0, 0.0)
    admission_outside = [b - a for a, b in gaps if _overlap(a, b, p0, p1) == 0.0]
    # Idle: a replica's time in the window, alive and in the fleet, with no Generate running.
    idle, alive_total, ideal, ideal_outside = [], 0.0, 0.0, 0.0
    for r in replicas:
        start, end = max(r["started"], t0), min(r["ended"] or t1, t1)
        if end - start < 1.0:
            continue
        busy = sum(_overlap(a, b, start, end) for a, b in r["busy"])
        idle.append(1 - busy / (end - start))
        alive_total += end - start
        ideal += (end - start) * ideal_per_replica / r["factor"]
        ideal_outside += outside_seconds(start, end, pause) * ideal_per_replica / r["factor"]
    # Through the controller: groups scored (into the buffer) in the window, which flows evenly; the
    # trained rate comes in bursts of a batch, so it is taken over the whole steps in the window.
    # A straggler's groups: trained (in a later batch, within the bound) or dropped as stale; the
    # batch never waits for them at S >= 1 (docs: "a straggler holds a step back by its share only")
    trained_seqs = {e["seq"] for e in trained}
    dropped_seqs = {e["seq"] for e in events if e["event"] == "dropped"}
    slow = [r for r in replicas if r["factor"] > 1]
    slow_seqs = {seq for r in slow for seq, *_ in r["sent"]}
    straggler = {"replicas": len(slow), "groups": len(slow_seqs), "trained": len(slow_seqs & trained_seqs),
                 "dropped": len(slow_seqs & dropped_seqs)} if slow else {}
    groups = sum(t0 <= t <= t1 for t in scored.values())
    groups_outside = sum(t0 <= t <= t1 and not (pause and pause[0] <= t <= pause[1]) for t in scored.values())
    span = t1 - t0
    done = sorted(s["done"] for s in steps if t0 <= s["done"] <= t1)
    batch_groups = steps[-1]["samples"] / samples_per_group if steps else 0
    trained_rate = (len(done) - 1) * batch_groups / (done[-1] - done[0]) if len(done) > 1 else float("nan")
    found = audit(run_dir / "journal" / "prompts.jsonl")
    ages = Counter(e["version"] - e["generation_version"] for e in trained)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    sync = [m["timing/weight_sync_s"] for m in metrics if "timing/weight_sync_s" in m]
    # The Train call beyond the modelled training: building, sending and parsing the batch, the reply
    # (and a push holding the learner's lock); the churn run's learner pause is taken out.
    by_step = {s["step"]: s for s in steps}
    train_extra = [m["timing/train_s"] - by_step[m["step"]]["modelled_s"] - by_step[m["step"]]["paused_s"]
                   for m in metrics if m.get("step") in by_step and "modelled_s" in by_step[m["step"]]
                   and t0 <= by_step[m["step"]]["done"] <= t1]
    return {
        "window": [t0, t1], "cpu": list(cpu), "rss_mb": rss_mb,
        "window_s": span, "groups": groups, "groups_per_s": groups / span,
        "trained_groups_per_s": trained_rate, "steps_in_window": len(done),
        "reforms_in_window": sum(e["event"] == "weight_group_rebuilt" and t0 <= e["t"] <= t1 for e in events),
        "ideal_groups_per_s": ideal / span, "fraction_of_ideal": groups / ideal if ideal else float("nan"),
        # the learner's pause holds every slot at S = 1 by design (the staleness gate): the fleet's rate
        # with the pause taken out of the window (its groups and its replica-seconds alike)
        "fraction_of_ideal_outside_pause": groups_outside / ideal_outside if ideal_outside else float("nan"),
        "controller_cpu_s": cpu[1] - cpu[0],
        "controller_cpu_ms_per_group": 1000 * (cpu[1] - cpu[0]) / max(1, groups),
        "controller_cpu_share": (cpu[1] - cpu[0]) / span,
        "controller_rss_mb_max": max(rss_mb) if rss_mb else float("nan"),
        "controller_rss_mb_last": rss_mb[-1] if rss_mb else float("nan"),
        "to_buffer_ms_p50": 1000 * percentile(to_buffer, 50),
        "to_buffer_ms_p99": 1000 * percentile(to_buffer, 99),
        "receive_ms_p50": 1000 * percentile(to_controller, 50),
        "receive_ms_p99": 1000 * percentile(to_controller, 99),
        "score_ms_p50": 1000 * percentile(to_scored, 50), "score_ms_p99": 1000 * percentile(to_scored, 99),
        "admission_ms_p50": 1000 * percentile(admission, 50),
        "admission_ms_p99": 1000 * percentile(admission, 99),
        "admission_ms_p99_outside_pause": 1000 * percentile(admission_outside, 99),
        "admission_count": len(admission), "pause_window": list(pause) if pause else None,
        "controller_admission_ms_p50": 1000 * percentile(own, 50),
        "controller_admission_ms_p99": 1000 * percentile(own, 99), "controller_admission_count": len(own),
        "train_call_beyond_modelled_s_p50": percentile(train_extra, 50),
        "train_call_beyond_modelled_s_max": max(train_extra) if train_extra else float("nan"),
        "to_batch_ms_p50": 1000 * percentile(to_batch, 50),
        "to_batch_ms_p99": 1000 * percentile(to_batch, 99),
        "staleness_hist": {str(k): v for k, v in sorted(ages.items())},
        "staleness_max": max(ages) if ages else 0, "staleness_bound": staleness,
        "idle_mean": sum(idle) / len(idle) if idle else float("nan"),
        "idle_p90": percentile(idle, 90),
        "replicas_seen": len(replicas), "replica_seconds": alive_total,
        # status calls the replicas answered (heartbeat, re-forms, Joins), a second of the window
        "rollout_status_calls_per_s": sum(t0 <= t <= t1 for r in replicas for t in r.get("status_times", ()))
        / span,
        "host_lag_ms_p50": 1000 * percentile(lag, 50), "host_lag_ms_p99": 1000 * percentile(lag, 99),
        "host_cpu_share": [h["cpu_s"] / h["wall_s"] for h in hosts],
        "weight_sync_s_p50": percentile(sync, 50), "weight_sync_s_max": max(sync) if sync else float("nan"),
        "steps": len(metrics), "lost": found.lost, "trained_twice": found.trained_twice,
        # apart from "requeued": held at the stop, and stranded (their replica left, no requeue)
        "requeued": found.requeued_by_reason(), "stranded": found.stranded,
        "in_flight_at_stop": len(found.in_flight_at_stop),
        "in_flight_at_stop_s_max": max(found.in_flight_at_stop.values(), default=0.0),
        "generation_s_max": found.generation_s_max,
        "invariant_errors": found.invariant_errors(max_in_flight_bound(found.generation_s_max)),
        "dropped": dict(Counter(found.dropped.values())),
        "killed": sum(r["fate"] == "killed" for r in replicas), "straggler": straggler,
        "joined_late": sum(r["started"] > t0 for r in replicas),
        **membership(events, t0, t1),
    }


def controller_admission(replicas: list[dict], events: list[dict], t0: float, t1: float) -> list[float]:
    """For each replica's gap between two Generates (the first ending in [t0, t1]): the gap less the
    time admission held the slot back, from the dispatch that started the second (the journal's last
    `dispatched` of its first group before it began). A member refused work was held from when the slot
    was freed or admission last gave work (`held_since`), whichever is later, to its hand-out
    (`handed_t`): a slot freed while the gate was closed could not have been filled sooner, however late
    the controller saw it free. Otherwise (code before those fields) from when the controller saw it
    free: `held_s`. Gaps whose dispatch carries no `held_s` (code before it) are left out."""
    dispatched: dict[int, list[tuple[float, dict]]] = {}
    for e in events:
        if e["event"] == "dispatched" and "held_s" in e:
            dispatched.setdefault(e["seq"], []).append((e["t"], e))
    own = []
    for r in replicas:
        busy = sorted(r["busy"])
        sent = sorted((when, seq) for seq, _due, when, _v in r["sent"])
        for a, b in zip(busy, busy[1:]):
            if not t0 <= a[1] <= t1:
                continue
            first = next((seq for when, seq in sent if b[0] <= when <= b[1]), None)
            lines = [e for t, e in dispatched.get(first, []) if t <= b[0] + 0.01]
            if lines:
                own.append(max(0.0, b[0] - a[1] - _held_back(lines[-1], a[1])))
    return own


def _held_back(dispatched: dict, freed: float) -> float:
    """Seconds admission held back a slot freed at `freed`, by its `dispatched` line."""
    if "held_since" in dispatched:
        return max(0.0, dispatched["handed_t"] - max(freed, dispatched["held_since"]))
    return dispatched["held_s"]


def max_in_flight_bound(generation_s_max: float) -> float:
    """How long a prompt may have been out at the stop: twice the longest dispatch -> generated of the
    groups that came back (the slow replica's included), 5 s at least. A group held longer never came
    back: its replica died and nobody re-queued it (issue 42: 88 prompts held 54-89 s until the stop)."""
    return max(5.0, 2.0 * generation_s_max)


def membership(events: list[dict], t0: float, t1: float) -> dict:
    """Joins and re-forms in the window, from the journal: Joins accepted, joiners taken in (`joined`)
    and turned away (`left` with `join_failed`), members left out of a re-form, re-forms retried, and
    how long each re-form took (`weight_group_rebuilt`'s seconds, from its first try to its commit)."""
    inside = [e for e in events if t0 <= e["t"] <= t1]
    reforms = [e["seconds"] for e in inside if e["event"] == "weight_group_rebuilt" and "seconds" in e]
    return {
        "joins_accepted": sum(e["event"] == "join_accepted" for e in inside),
        "joins_taken_in": sum(e["event"] == "joined" for e in inside),
        "joins_turned_away": sum(e["event"] == "left" and e.get("reason") == "join_failed" for e in inside),
        "left_by_reason": dict(Counter(e.get("reason") for e in inside if e["event"] == "left")),
        "reform_retries": sum(e["event"] == "weight_group_retry" for e in inside),
        "reform_left_out": sum(len(e.get("replicas", [])) for e in inside
                               if e["event"] == "weight_group_left_out"),
        "reform_s_p50": percentile(reforms, 50), "reform_s_max": max(reforms) if reforms else float("nan"),
    }


def reanalyse(case: Path) -> dict:
    old = json.loads((case / "result.json").read_text())
    pause = old.get("pause_window")
    if pause is None and old.get("churn"):  # runs before the field: fleet_sim's defaults (20 s, 30 s)
        pause = [old["window"][0] + 20.0, old["window"][0] + 50.0]
    new = analyse(case, case / "run", tuple(old["window"]), tuple(old["cpu"]), old["rss_mb"],
                  old["ideal_per_replica_real"] / old["slowdown"], old["staleness"],
                  pause=tuple(pause) if pause else None)
    merged = {**old, **new}
    (case / "result.json").write_text(json.dumps(merged, indent=1))
    return merged


if __name__ == "__main__":
    import sys

    for folder in sys.argv[1:]:
        print(json.dumps(reanalyse(Path(folder))))
