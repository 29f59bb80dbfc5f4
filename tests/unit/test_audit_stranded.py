"""The journal's audit can fail (issue 42): prompts in flight at the stop and prompts whose replica left
without a requeue were counted as `requeued` (the stop re-queues whatever is live), so the fleet
simulator's invariant (nothing lost) held even when 88 prompts of 11 killed replicas sat in flight until
the stop. Journals written by hand, in the loop's own event format."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from controller.journal import audit

pytestmark = pytest.mark.unit


def _journal(tmp_path: Path, events: list[dict]) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def _round(seq: int, t: float, replica: str) -> list[dict]:
    """A prompt dispatched at t, generated 1 s later, trained at t + 2."""
    return [{"event": "dispatched", "t": t, "seq": seq, "replica": replica},
            {"event": "generated", "t": t + 1, "seq": seq, "replica": replica},
            {"event": "trained", "t": t + 2, "seq": seq, "step": 1}]


def test_a_prompt_whose_replica_left_without_a_requeue_is_stranded_and_fails_the_invariant(tmp_path):
    events = [*_round(0, 0.0, "a:1"), *_round(1, 0.0, "b:2"),
              {"event": "dispatched", "t": 10.0, "seq": 2, "replica": "b:2"},
              {"event": "left", "t": 11.0, "replica": "b:2", "reason": "failed"},  # no requeue of seq 2
              {"event": "dispatched", "t": 12.0, "seq": 3, "replica": "a:1"},
              # the stop re-queues what is live: 2 (stranded 9 s) and 3 (in flight 0.5 s, normal)
              {"event": "requeued", "t": 12.5, "seq": 2, "reason": "stopped"},
              {"event": "requeued", "t": 12.5, "seq": 3, "reason": "stopped"}]
    result = audit(_journal(tmp_path, events))
    assert result.lost == []  # the old rule: re-queued at the stop, so not lost
    assert result.stranded == [2]
    assert result.in_flight_at_stop == {2: 2.5, 3: 0.5}  # seconds since the dispatch, at the stop
    assert result.requeued_by_reason() == {}  # a stop's requeue is not counted as a requeue
    # the longest generation that came back took 1 s: 2.5 s is past 2 x that; 0.5 s is not
    assert result.invariant_errors(max_in_flight_s=2.0) == [
        "1 prompts stranded: their replica left and they were not re-queued (seq 2)",
        "1 prompts in flight at the stop for longer than 2s (seq 2: 2.5s)"]


def test_a_replica_that_left_after_requeueing_its_prompts_keeps_the_invariant(tmp_path):
    events = [{"event": "dispatched", "t": 0.0, "seq": 0, "replica": "b:2"},
              {"event": "requeued", "t": 1.0, "seq": 0, "reason": "replica_left"},
              {"event": "left", "t": 1.0, "replica": "b:2", "reason": "failed"},
              *_round(0, 2.0, "a:1")]
    result = audit(_journal(tmp_path, events))
    assert result.stranded == [] and result.in_flight_at_stop == {}
    assert result.requeued_by_reason() == {"replica_left": 1}
    assert result.invariant_errors(max_in_flight_s=2.0) == []


def test_the_generation_times_bound_the_time_in_flight(tmp_path):
    events = [*_round(0, 0.0, "a:1"), *_round(1, 5.0, "a:1")]
    events[4]["t"] = 8.0  # seq 1 generated 3 s after its dispatch
    assert audit(_journal(tmp_path, events)).generation_s_max == 3.0
