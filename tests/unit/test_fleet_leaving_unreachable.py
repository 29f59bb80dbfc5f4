"""A replica being drained whose channel the drain cut (or that stopped answering) and that the
heartbeat then finds unreachable has left for the reason it was leaving: it reads `left: drained`
and stops. Read as `left: unreachable`, a drained replica joins the run again instead (seen in
tests/e2e/test_fleet_drain.py once a call on the closed channel counted as a missed heartbeat)."""
from __future__ import annotations

import pytest

from controller.fleet import LEAVING, Fleet
from rlfleet.errors import ServiceUnavailable
from rlfleet.types import ServiceStatus

pytestmark = pytest.mark.unit


class Replica:
    address = "10.0.0.7:50051"
    keepalive, streams, answered = False, 0, 0.0  # as a RolloutClient without a stream open

    def __init__(self) -> None:
        self.up = True

    def status(self, timeout_s: float = 10.0) -> ServiceStatus:
        if not self.up:
            raise ServiceUnavailable(f"rollout service at {self.address}: status failed: channel closed")
        return ServiceStatus("rollout", True, 0)

    def close(self) -> None:
        self.up = False


def _fleet_with(replica: Replica) -> Fleet:
    fleet = Fleet([], architecture={"model_type": "qwen2"}, connect=lambda address: replica, max_misses=1)
    fleet.join(replica.address, "", fleet.identity)
    return fleet


@pytest.mark.parametrize("notice", ["check", "prune"])
def test_a_leaving_replica_found_unreachable_has_left_for_its_leave_reason(notice):
    replica = Replica()
    fleet = _fleet_with(replica)
    [member] = fleet.members()
    member.state, member.leave_reason = LEAVING, "drained"  # as Fleet.leave sets them before it waits
    replica.close()  # the drain's timeout cut its stream
    getattr(fleet, notice)()
    assert {"address": replica.address, "state": "left: drained"}.items() <= fleet.describe()[-1].items()


def test_a_live_replica_found_unreachable_has_left_as_unreachable():
    replica = Replica()
    fleet = _fleet_with(replica)
    replica.up = False
    fleet.check()
    assert fleet.describe()[-1]["state"] == "left: unreachable"
