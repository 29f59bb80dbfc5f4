"""GetRunStatus is asked every 2 s by every joined replica (rlfleet/app/fleet_member.py's watch), and
each reply lists the whole fleet: 128 calls a second at N = 256, a quarter of the controller's CPU in
bench/fleet_sim.py (issue 34). Calls in quick succession share one reply, unless the fleet changed
in between: a replica that just joined or left is seen at once."""
from __future__ import annotations

import pytest

from controller.fleet import Fleet
from controller.status_servicer import ControllerServicer
from rlfleet.proto.v1 import common_pb2
from rlfleet.types import ServiceStatus

pytestmark = pytest.mark.unit


class Replica:
    def __init__(self, address: str) -> None:
        self.address = address

    def status(self, timeout_s: float = 10.0) -> ServiceStatus:
        return ServiceStatus("rollout", True, 0)

    def close(self) -> None:
        pass


class CountingFleet(Fleet):
    described = 0

    def describe(self):
        self.described += 1
        return super().describe()


class Loop:
    def __init__(self, fleet: Fleet) -> None:
        self.fleet, self.step, self.last_metrics = fleet, 3, {"policy_version": 3}

    def buffered(self) -> int:
        return 0


def _servicer():
    fleet = CountingFleet([], architecture={"model_type": "qwen2"}, connect=Replica)
    loop = Loop(fleet)
    return ControllerServicer("run", {}, lambda: loop), fleet


def test_calls_in_quick_succession_share_one_reply():
    servicer, fleet = _servicer()
    fleet.join("10.0.0.1:1", "", fleet.identity)
    first = servicer.GetRunStatus(common_pb2.GetStatusRequest(), None)
    second = servicer.GetRunStatus(common_pb2.GetStatusRequest(), None)
    assert fleet.described == 1 and second == first


def test_a_change_of_the_fleet_is_seen_by_the_next_call():
    servicer, fleet = _servicer()
    fleet.join("10.0.0.1:1", "", fleet.identity)
    servicer.GetRunStatus(common_pb2.GetStatusRequest(), None)
    fleet.join("10.0.0.2:1", "", fleet.identity)
    reply = servicer.GetRunStatus(common_pb2.GetStatusRequest(), None)
    assert {m.address for m in reply.fleet} == {"10.0.0.1:1", "10.0.0.2:1"}
    fleet.remove(fleet.find("10.0.0.1:1"), "drained")
    reply = servicer.GetRunStatus(common_pb2.GetStatusRequest(), None)
    assert {m.address: m.state for m in reply.fleet}["10.0.0.1:1"] == "left: drained"


def test_a_new_step_is_seen_by_the_next_call():
    servicer, fleet = _servicer()
    servicer.GetRunStatus(common_pb2.GetStatusRequest(), None)
    servicer._loop().step = 4
    assert servicer.GetRunStatus(common_pb2.GetStatusRequest(), None).step == 4
