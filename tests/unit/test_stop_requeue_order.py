"""A run's stop re-queues its admitted prompts (journal `requeued`, reason `stopped`); a prompt whose
`dispatched` line came after that re-queue line was open and not re-queued in the journal: lost to a
resume. The fresh-clone suite caught it once (tests/unit/test_loop_recovery.py, seq 8 and 9 lost): a
member handed its work before the stop, preempted before it wrote its `dispatched` line, wrote it after
the training thread's re-queue lines. Here that order is built by hand."""
from __future__ import annotations

import pytest

from controller.journal import audit
from controller.recovery import Stopped
from tests.unit.test_loop_recovery import Faults, make_loop


def test_a_dispatch_handed_out_before_the_stop_is_not_journalled_after_its_requeue(tmp_path):
    loop, _ = make_loop(tmp_path, Faults(), staleness=1)
    with loop._cond:
        dispatch = loop._next_work()  # handed to a member, whose task has not written its line yet
    assert dispatch is not None
    loop.stop.set()
    loop.requeue_live_on_stop()  # the training thread's stop
    with pytest.raises(Stopped):
        loop._record_dispatch(dispatch, "replica:1", {"held_s": 0.0})  # the member, preempted until now
    loop.journal.close()
    result = audit(tmp_path / "journal" / "prompts.jsonl")
    assert result.lost == [] and result.trained_twice == []
    assert result.requeued == {seq for seq, _ in dispatch.members}
