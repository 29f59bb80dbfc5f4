"""A member that dies inside the weight group costs the re-form a round trip, not the group's rank wait
(issue 44, part C).

The fleet simulator at N=256 with churn: a member died after the group was opened; its pull failed at
once, but the learner's push waited its rank-connect wait (min(timeout, 20 s)) for it, and
WeightSync._settle waited for that push before the next open: 22 s a re-form. Now the controller aborts
the learner's push on that group when a pull fails, and the re-form over the survivors starts at once.

The learner here is the real LearnerServicer, reached through the controller's LearnerClient over gRPC,
with the simulator's learner behind it (bench/fleetsim/learner.py: its weight group is a rendezvous over
real sockets that waits for every rank as rlfleet.weights.group does). The members are rollout clients
whose pulls are that rendezvous's members; one dies (its pull refused at once, its socket gone).
"""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from bench.fleetsim.rendezvous import MEMBER_WAIT_S, RendezvousMember
from controller.reform import MembersFailed
from controller.weight_sync import WeightSync
from rlfleet.errors import RlfleetError, ServiceUnavailable
from rlfleet.types import ServiceStatus
from tests.sim_services import sim_learner

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]

TIMEOUT_S = 60.0  # learner.weight_sync_timeout_s: the rank wait is then MEMBER_WAIT_S (20 s)


class SocketRollout:
    """A rollout replica's weight calls, as its service answers them: its rank joins the learner's
    rendezvous; once `die()` is called its process is gone (socket closed, every call refused)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.member: RendezvousMember | None = None
        self.dead = False

    def die(self) -> None:
        self.dead = True
        if self.member is not None:
            self.member.close()

    def _alive(self) -> None:
        if self.dead:
            raise ServiceUnavailable(f"rollout service at {self.address}: failed with UNAVAILABLE: "
                                     "Connection refused")

    def status(self, timeout_s: float = 10.0) -> ServiceStatus:
        self._alive()
        return ServiceStatus("rollout", True, stats={"weight_ranks": 1.0})

    def kept_status(self) -> None:
        return None  # no kept-alive channel watches it: every re-form asks its status

    def join_weight_group(self, address, rank, world_size, backend, timeout_s) -> None:
        self._alive()
        if self.member is not None:
            self.member.close()
        self.member = RendezvousMember(address, rank, timeout_s)

    def pull_weights(self, version, timeout_s, digest=False):
        self._alive()
        self.member.pull(version)
        return SimpleNamespace(version=version, digest="")


@pytest.fixture
def learner(tmp_path):
    with sim_learner(tmp_path) as client:
        yield client


def test_a_member_dead_inside_the_group_does_not_hold_the_next_reform(learner):
    rollouts = [SocketRollout(f"replica-{i}:1") for i in range(3)]
    sync = WeightSync(learner, rollouts, TIMEOUT_S)
    try:
        sync.open()
        rollouts[2].die()  # after the group was opened, before its ranks connected
        began = time.monotonic()
        with pytest.raises(MembersFailed) as failed:
            sync.sync(0)
        assert list(failed.value.failures) == [rollouts[2]]
        # the re-form over the survivors, as controller/recovery.py runs it
        sync.forget()
        sync.rollouts = rollouts[:2]
        sync.open()
        seconds = sync.sync(0)
        took = time.monotonic() - began
    finally:
        sync.close()
    assert seconds >= 0
    # without the abort, the next open waited for the push's rank wait (20 s) for the dead member
    assert took < MEMBER_WAIT_S / 2, f"the re-form took {took:.1f}s"


def test_an_abort_must_name_its_group(learner):
    """Never "the group opened last" by default: an abort without an address is refused, naming why;
    one naming a group the learner does not hold does nothing."""
    with pytest.raises(RlfleetError, match="INVALID_ARGUMENT.*weight group address must be 'host:port'"):
        learner.abort_weight_group("", "stray")
    assert learner.abort_weight_group("127.0.0.1:1", "stray") is False
