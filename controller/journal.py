"""The prompt journal: one JSONL line per lifecycle event of every prompt, written as it happens.

`<run_dir>/journal/prompts.jsonl` gets, per admitted prompt (identified by its admission
sequence number `seq`, which a re-queued prompt keeps):

    dispatched  sent to a rollout (version: the rollout's policy version then)
    generated   its group came back (version: the oldest version that generated it, replica)
    scored      rewards obtained (failed: samples without a reward)
    trained     in the batch of `step`, trained against policy `version`
    dropped     left out with a `reason` (stale, unusable, filtered)
    requeued    will be dispatched again with a `reason` (rollout_failed, resume)
    resumed     (no seq) the run continued from the checkpoint of `step`: `trained` lines of
                later steps before it were rolled back with the model

and the rollout fleet's membership (controller/fleet.py), per `replica` address: join_accepted,
joined, leaving, left (with its `reason`).

`audit()` replays a journal and says which prompts were lost or trained twice, which were in flight
at the stop (and for how long) and which were stranded (their replica left and they were not
re-queued), apart from the prompts re-queued by a failure or a leave; `departed_replicas()` which
replicas left the run and did not join again.
"""
from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

JOURNAL = "prompts.jsonl"
STOPPED = "stopped"  # the reason of the requeue a stop writes for every prompt still live
_LINE = orjson.OPT_APPEND_NEWLINE | orjson.OPT_NON_STR_KEYS


class Journal:
    """Each line reaches the file (the OS) before `record` returns, as one write of the whole line to a
    file opened for appending: a crash of the controller loses no line it recorded and cuts none.
    Encoded by orjson (compact: `{"event":"trained",...}`), ~2.5x cheaper than json.dumps through a
    line-buffered text file; it records 4 lines a group (issue 44)."""

    def __init__(self, run_dir: Path):
        folder = run_dir / "journal"
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / JOURNAL
        self._lock = threading.Lock()  # a write against close(): never a line into a reused descriptor
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def record(self, event: str, **fields: Any) -> None:
        self._write(orjson.dumps({"event": event, "t": round(time.time(), 3), **fields}, option=_LINE))

    def record_all(self, event: str, rows: list[dict[str, Any]]) -> None:
        """A line per row (its fields), all in one write: a step's 2,048 `trained` lines at N = 256 were
        2,048 writes in a row by the training thread, each giving the GIL up and waiting for it back
        behind the stream threads (issue 44)."""
        t = round(time.time(), 3)
        self._write(b"".join(orjson.dumps({"event": event, "t": t, **row}, option=_LINE) for row in rows))

    def _write(self, data: bytes) -> None:
        with self._lock:
            if self._fd >= 0 and data:
                _write_all(self._fd, data)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


@dataclass
class Audit:
    dispatched: set[int] = field(default_factory=set)
    trained: Counter = field(default_factory=Counter)
    dropped: dict[int, str] = field(default_factory=dict)
    requeued: set[int] = field(default_factory=set)
    # dispatched, neither trained nor dropped (in flight at the end)
    open: set[int] = field(default_factory=set)
    # requeue events by reason, the stop's own (`stopped`) left out
    requeues: Counter = field(default_factory=Counter)
    # prompts whose group had not come back when the run stopped: seconds since their dispatch
    in_flight_at_stop: dict[int, float] = field(default_factory=dict)
    # prompts in flight at the end whose replica left after their dispatch, with no requeue since
    stranded: list[int] = field(default_factory=list)
    generation_s_max: float = 0.0  # the longest dispatch -> generated of a group that came back

    @property
    def trained_twice(self) -> list[int]:
        return sorted(s for s, n in self.trained.items() if n > 1)

    @property
    def lost(self) -> list[int]:
        """Dispatched prompts whose last word is neither trained, dropped nor re-queued."""
        return sorted(s for s in self.open if s not in self.requeued)

    def requeued_by_reason(self) -> dict[str, int]:
        return dict(self.requeues)

    def invariant_errors(self, max_in_flight_s: float) -> list[str]:
        """What breaks the run's invariant: prompts lost, trained twice, stranded, or in flight at the
        stop for longer than `max_in_flight_s` (a group that never came back, held until the stop)."""
        errors = []
        if self.lost:
            errors.append(f"{len(self.lost)} prompts lost (seq {_some(self.lost)})")
        if self.trained_twice:
            errors.append(f"{len(self.trained_twice)} prompts trained twice "
                          f"(seq {_some(self.trained_twice)})")
        if self.stranded:
            errors.append(f"{len(self.stranded)} prompts stranded: their replica left and they were not "
                          f"re-queued (seq {_some(self.stranded)})")
        held = {s: t for s, t in sorted(self.in_flight_at_stop.items()) if t > max_in_flight_s}
        if held:
            errors.append(f"{len(held)} prompts in flight at the stop for longer than {max_in_flight_s:g}s ("
                          + ", ".join(f"seq {s}: {t:g}s" for s, t in list(held.items())[:10]) + ")")
        return errors


def _some(seqs: list[int]) -> str:
    return ", ".join(map(str, seqs[:10])) + (", …" if len(seqs) > 10 else "")


def read_journal(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def audit(path: Path) -> Audit:
    """Replays the journal. A prompt is open from its dispatch until trained or dropped; a
    re-queue keeps it open (it must be dispatched and trained again); a `resumed` event rolls
    back training of later steps (those prompts are open again: the resumed run re-queues them)."""
    result = Audit()
    trained_at: dict[int, list[int]] = {}
    # the prompt's last dispatch (time, replica) while its group has not come back nor been re-queued
    out: dict[int, tuple[float, str]] = {}
    left: dict[str, float] = {}  # replica -> when it last left
    for ev in read_journal(path):
        kind, seq = ev["event"], ev.get("seq")
        if kind == "left" and "replica" in ev:
            left[ev["replica"]] = ev.get("t", 0.0)
        elif kind in ("join_accepted", "joined") and "replica" in ev:
            left.pop(ev["replica"], None)
        if kind == "resumed":
            for s, steps in trained_at.items():
                kept = [st for st in steps if st <= ev["step"]]
                if len(kept) != len(steps):
                    trained_at[s] = kept
                    result.open.add(s)
            continue
        if seq is None:
            continue
        if kind == "dispatched":
            result.dispatched.add(seq)
            result.open.add(seq)
            result.requeued.discard(seq)
            out[seq] = (ev.get("t", 0.0), ev.get("replica", ""))
        elif kind == "generated":
            if seq in out:
                result.generation_s_max = max(result.generation_s_max, ev.get("t", 0.0) - out.pop(seq)[0])
        elif kind == "requeued":
            result.requeued.add(seq)
            if ev.get("reason") != STOPPED:
                result.requeues[ev.get("reason", "")] += 1
                out.pop(seq, None)
            elif seq in out:  # the stop found its group still out
                sent, replica = out.pop(seq)
                result.in_flight_at_stop[seq] = round(ev.get("t", 0.0) - sent, 3)
                if replica in left and left[replica] >= sent:
                    result.stranded.append(seq)
        elif kind == "trained":
            trained_at.setdefault(seq, []).append(ev["step"])
            result.open.discard(seq)
        elif kind == "dropped":
            result.dropped[seq] = ev.get("reason", "")
            result.open.discard(seq)
    for seq, (sent, replica) in out.items():  # no stop line (a killed controller): out at the end
        if seq in result.open and replica in left and left[replica] >= sent:
            result.stranded.append(seq)
    result.stranded.sort()
    result.trained = Counter({s: len(steps) for s, steps in trained_at.items() if steps})
    return result


# A membership line, as Journal writes it (compact) and as journals written before issue 44 have it
_MEMBERSHIP_WORDS = ('"event":"left"', '"event":"join', '"event": "left"', '"event": "join')


def departed_replicas(path: Path) -> dict[str, str]:
    """Replicas whose last membership event is `left` (address -> reason): out of the run, unless they
    joined again. {} when there is no journal."""
    departed: dict[str, str] = {}
    try:
        lines = open(path)  # noqa: SIM115 - closed below; a long run's journal is read a line at a time
    except OSError:
        return departed
    with lines:
        for line in lines:
            if not any(words in line for words in _MEMBERSHIP_WORDS):
                continue  # most lines are about prompts: not parsed
            try:
                ev = json.loads(line)
                kind, replica = ev["event"], ev["replica"]
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short by a crash
            if kind == "left":
                departed[replica] = ev.get("reason", "")
            elif kind in ("join_accepted", "joined"):
                departed.pop(replica, None)
    return departed
