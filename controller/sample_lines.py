"""The lines of samples/train.jsonl: a record per sample (prompt, response, reward, versions, an
episode's turns), and the same records' JSON made a group at a time as groups are scored (issue 44).

A record's fields are its group's alone except `step` and `trained_version`, known only when a step
takes the group. So each record is kept as two pieces of JSON, what comes between those two fields and
what comes after; the step's lines then only join bytes. Made all at once after each step, a whole
batch's records held the GIL against the event loop just as the new weights let the held members go.
The joined line is byte for byte orjson's line of the whole record (compact JSON: an object's members
are its key-value pairs joined by commas, in insertion order).
"""
from __future__ import annotations

from typing import Any

import orjson

from controller.episodes import turn_records
from controller.groups import ScoredGroup
from rlfleet.types import Completion, ScoreResult

_JSON = orjson.OPT_NON_STR_KEYS  # as RunWriter.log_samples writes a record


def record_head(g: ScoredGroup, c: Completion, r: ScoreResult) -> dict[str, Any]:
    """A record's fields between `step` and `trained_version`."""
    prompt = g.prompt
    return {"prompt_index": prompt.index, "prompt": prompt.text, "response": c.text,
            "reward": r.score if r.ok else None, "reward_error": r.error or None, "version": c.policy_version}


def record_tail(g: ScoredGroup, c: Completion) -> dict[str, Any]:
    """A record's fields after `trained_version`: the replica, versions, finish, and an episode's."""
    tail = {"replica": g.replica, "last_version": max(c.last_policy_version, c.policy_version),
            "finish_reason": c.finish_reason, "ground_truth": g.prompt.ground_truth}
    # an episode's fields only where there are any (updated, not splatted from an empty dict a sample:
    # ~20 % of the record's cost, issue 44)
    if c.turns or c.failed:
        tail.update({"turns": turn_records(c), "env_reward": c.env_reward,
                     "env_failure": c.env_failure or None, "env_error": c.env_error or None,
                     **({"env_metrics": c.env_metrics} if c.env_metrics else {}),
                     **({"prompt_trim": c.prompt_trim} if c.prompt_trim else {})})
    return tail


def sample_record(step: int, train_version: int | None, g: ScoredGroup, c: Completion,
                  r: ScoreResult) -> dict[str, Any]:
    return {"step": step, **record_head(g, c, r), "trained_version": train_version, **record_tail(g, c)}


def group_pieces(g: ScoredGroup) -> list[tuple[bytes, bytes]]:
    """Per sample of the group, in order: the JSON members of its record head and tail (no braces)."""
    dumps = orjson.dumps
    return [(dumps(record_head(g, c, r), option=_JSON)[1:-1], dumps(record_tail(g, c), option=_JSON)[1:-1])
            for c, r in zip(g.completions, g.results)]


def step_lines(step: int, train_version: int, groups: list[ScoredGroup], limit: int | None) -> bytes:
    """The step's lines for samples/train.jsonl, of the first `limit` samples (all when None), from each
    group's pieces (made now where a group has none)."""
    head = b'{"step":' + orjson.dumps(step) + b","
    middle = b',"trained_version":' + orjson.dumps(train_version) + b","
    end = b"}\n"
    parts: list[bytes] = []  # joined once: the lines' megabytes a step are copied once, not twice
    left = limit
    for g in groups:
        if left is not None and left <= 0:
            break
        pieces = g.record_pieces if g.record_pieces is not None else group_pieces(g)
        if left is not None:
            pieces = pieces[:left]
            left -= len(pieces)
        for a, b in pieces:
            parts += (head, a, middle, b, end)
    return b"".join(parts)
