"""Who the re-formed weight group takes when members fail during the re-form (controller/reform.py)."""
from __future__ import annotations

import pytest

from controller.reform import MembersFailed, member_failed, next_group, seats
from rlfleet.errors import (
    Busy,
    InvalidRequest,
    NotReady,
    RlfleetError,
    ServiceUnavailable,
    VersionMismatch,
    WeightSyncError,
)

pytestmark = pytest.mark.unit


def test_seats_hand_out_consecutive_ranks_after_the_learner():
    # rank 0 is the learner; a: 1 rank -> 1; b: 2 ranks (tensor parallel) -> 2, 3; c: 1 rank -> 4
    assert seats([1, 2, 1]) == (5, [1, 2, 4])
    # b failed after the ranks were handed out: the next try hands them out afresh over a and c
    assert seats([1, 1]) == (3, [1, 2])
    assert seats([]) == (1, [])


def test_the_next_group_leaves_failed_joiners_out_and_waits_for_failed_founders():
    # founders f1, f2 started with the run; j1..j3 joined while it went on
    members = ["f1", "j1", "f2", "j2", "j3"]
    joined = {"j1", "j2", "j3"}.__contains__
    plan = next_group(members, {"j1": ServiceUnavailable("x"), "j3": ServiceUnavailable("x")}, joined)
    assert plan.survivors == ["f1", "f2", "j2"]  # in the fleet's order
    assert plan.leaving == ["j1", "j3"] and plan.waited == []
    plan = next_group(members, {"f2", "j2"}, joined)
    assert plan.survivors == ["f1", "j1", "j3"] and plan.leaving == ["j2"] and plan.waited == ["f2"]
    plan = next_group(members, set(), joined)
    assert plan.survivors == members and plan.leaving == plan.waited == []


@pytest.mark.parametrize("error, blamed", [
    (ServiceUnavailable("rollout service at h:1: JoinWeightGroup failed with UNAVAILABLE"), True),
    (InvalidRequest("weight backend 'ipc' needs the rollout on the learner's GPU"), True),
    (NotReady("not in a weight group: call JoinWeightGroup first"), True),
    (RlfleetError("rollout service at h:1: PullWeights failed with INTERNAL"), True),
    (VersionMismatch("PullWeights: expected version 4, the push sent 3"), True),
    (Busy("PullWeights is in progress"), False),
    (WeightSyncError("weight group generation 0: rank(s) [2] did not connect within 20s"), False),
    (ValueError("a bug"), False),
])
def test_which_errors_blame_the_member(error, blamed):
    # dead, unreachable or refusing blames the member; Busy passes, and a broken group is anyone's doing
    assert member_failed(error) is blamed


def test_members_failed_says_the_first_error_and_how_many_more():
    one = MembersFailed("join", {"a": ServiceUnavailable("rollout service at a:1: UNAVAILABLE")})
    assert str(one) == "rollout service at a:1: UNAVAILABLE" and one.stage == "join"
    two = MembersFailed("pull", {"a": ServiceUnavailable("a gone"), "b": ServiceUnavailable("b gone")})
    assert str(two) == "a gone (and 1 more member(s))"
    assert isinstance(two, WeightSyncError)  # retried where any failed push is
