"""controller/payload_loss.py: when the learner cannot fetch a step's payloads (data_plane=flight), the
groups held at the replica its error names are the ones re-queued; any other error re-queues nothing."""
from __future__ import annotations

import pytest

from rlfleet.data.prompts import Prompt
from rlfleet.errors import RlfleetError
from rlfleet.types import Completion, PayloadRef, ScoreResult
from controller.groups import ScoredGroup
from controller.payload_loss import lost_groups

pytestmark = pytest.mark.unit


def _group(seq: int, address: str | None) -> ScoredGroup:
    prompt = Prompt(seq, "q", [1, 2], "t", "1")
    ref = PayloadRef(address, f"p{seq}-s{seq}", 0, 3) if address else None
    return ScoredGroup(seq, prompt, [Completion([], [], "stop", 0, payload=ref)], [ScoreResult("x", 1.0)])


def test_the_groups_at_the_named_replica_are_lost():
    groups = [_group(0, "10.0.0.1:7001"), _group(1, "10.0.0.2:7001"), _group(2, "10.0.0.1:7001")]
    error = RlfleetError("learner service at 127.0.0.1:5: Train failed with FAILED_PRECONDITION: 2 "
                         "group(s) at 10.0.0.1:7001 could not be fetched: data plane fetch at "
                         "10.0.0.1:7001: unreachable")
    assert [g.seq for g in lost_groups(groups, error)] == [0, 2]


def test_other_errors_and_inline_groups_lose_nothing():
    groups = [_group(0, "10.0.0.1:7001"), _group(1, None)]
    assert lost_groups(groups, RlfleetError("Train failed with INTERNAL: 10.0.0.1:7001 out of memory")) == []
    named_nowhere = RlfleetError("Train failed with FAILED_PRECONDITION: group at 10.0.0.9:1 is gone")
    assert lost_groups(groups, named_nowhere) == []
