"""The heartbeat asks only the members it has not heard from lately: a member whose stream just
delivered a group is alive, and a status call per member per second is what a 256-replica fleet's
controller spent ~0.3 cores on (bench/fleet_sim.py, issue 34). A member not heard from is still asked,
and one that stops answering still leaves after max_misses.

Issue 44: a member whose Generate stream is open on a channel that pings it (keepalive) is watched by
those pings, not asked (a frozen one fails its stream: tests/service/test_fleet_keepalive.py); those
asked are asked all at once, not one after another. A member with no stream open is watched by the same
pings while its connection is READY (tests/service/test_fleet_idle_watch.py with real processes); once
that connection is lost it has been silent for a while already, so one missed status call removes it."""
from __future__ import annotations

import threading
import time

import pytest

from controller.fleet import Fleet
from rlfleet.errors import ServiceUnavailable
from rlfleet.types import ServiceStatus

pytestmark = pytest.mark.unit


class Replica:
    """What the fleet reads of a RolloutClient: its status, its open Generate streams, whether its
    channel pings (keepalive) and its connection is up, when its last stream answered."""

    def __init__(self, address: str, keepalive: bool = False) -> None:
        self.address = address
        self.up = True
        self.status_calls = 0
        self.keepalive = keepalive
        self.streams = 0
        self.connected = False  # its channel's connection READY (kept alive by pings with no call open)
        self.answered = 0.0
        self.together: threading.Barrier | None = None  # status waits here for the others' calls

    def status(self, timeout_s: float = 10.0) -> ServiceStatus:
        self.status_calls += 1
        if self.together is not None:
            try:
                self.together.wait()
            except threading.BrokenBarrierError:
                raise ServiceUnavailable(f"{self.address}: asked alone") from None
        if not self.up:
            raise ServiceUnavailable(f"rollout service at {self.address}: status failed: connection refused")
        return ServiceStatus("rollout", True, 0)

    def close(self) -> None:
        pass


def _fleet(*replicas: Replica, heartbeat_s: float = 60.0) -> Fleet:
    by_address = {r.address: r for r in replicas}
    fleet = Fleet([], architecture={"model_type": "qwen2"}, connect=by_address.__getitem__, max_misses=2,
                  heartbeat_s=heartbeat_s)
    for replica in replicas:
        fleet.join(replica.address, "", fleet.identity)
        replica.status_calls = 0  # the join's own call back
    return fleet


def test_a_member_heard_from_within_the_heartbeat_period_is_not_asked():
    heard, silent = Replica("10.0.0.1:1"), Replica("10.0.0.2:1")
    fleet = _fleet(heard, silent)
    fleet.heard_from(fleet.find(heard.address))
    fleet.check()
    assert (heard.status_calls, silent.status_calls) == (0, 1)


def test_a_member_heard_from_longer_ago_than_the_period_is_asked_again():
    replica = Replica("10.0.0.1:1")
    fleet = _fleet(replica, heartbeat_s=0.0)  # every word is older than a period of 0 s
    fleet.heard_from(fleet.find(replica.address))
    fleet.check()
    assert replica.status_calls == 1


def test_a_silent_member_that_stops_answering_still_leaves():
    replica = Replica("10.0.0.1:1")
    fleet = _fleet(replica)
    replica.up = False
    fleet.check()
    fleet.check()
    assert fleet.describe()[-1]["state"] == "left: unreachable"


def test_a_member_streaming_on_a_kept_alive_channel_is_not_asked():
    replica = Replica("10.0.0.1:1", keepalive=True)
    fleet = _fleet(replica, heartbeat_s=0.0)
    replica.streams = 1
    fleet.check()
    assert replica.status_calls == 0


def test_a_member_streaming_on_a_channel_without_keepalive_is_still_asked():
    replica = Replica("10.0.0.1:1", keepalive=False)  # nothing would notice it freeze
    fleet = _fleet(replica, heartbeat_s=0.0)
    replica.streams = 1
    fleet.check()
    assert replica.status_calls == 1


def test_a_member_whose_stream_just_ended_is_not_asked():
    replica = Replica("10.0.0.1:1", keepalive=True)
    fleet = _fleet(replica)
    replica.answered = time.monotonic()  # its stream ended OK now: it answered
    fleet.check()
    assert replica.status_calls == 0


def test_the_members_asked_are_asked_at_once_not_one_after_another():
    """Each status call waits for the other two to be in flight (10 s at most): asked one after another,
    the first waits 10 s and all three fail; asked at once, all three answer."""
    replicas = [Replica(f"10.0.0.{i}:1") for i in range(1, 4)]
    fleet = _fleet(*replicas)
    together = threading.Barrier(3, timeout=10)
    for replica in replicas:
        replica.together = together
    fleet.check()
    assert [fleet.find(r.address).misses for r in replicas] == [0, 0, 0]


def test_an_idle_member_whose_kept_alive_connection_is_up_is_not_asked():
    replica = Replica("10.0.0.1:1", keepalive=True)
    fleet = _fleet(replica, heartbeat_s=0.0)
    replica.connected = True
    fleet.check()
    assert replica.status_calls == 0


def test_a_connection_up_on_a_channel_without_keepalive_watches_nothing():
    replica = Replica("10.0.0.1:1", keepalive=False)  # its connection is not pinged: it may be frozen
    fleet = _fleet(replica, heartbeat_s=0.0)
    replica.connected = True
    fleet.check()
    assert replica.status_calls == 1


def test_a_member_whose_kept_alive_connection_was_lost_leaves_at_its_first_missed_status():
    """Its pings went unanswered (or its connection closed) before: one failed call decides, not
    max_misses of them, so the bound of a member asked every beat holds."""
    replica = Replica("10.0.0.1:1", keepalive=True)
    fleet = _fleet(replica, heartbeat_s=0.0)
    fleet.max_misses = 3
    replica.connected = True
    fleet.check()
    replica.connected, replica.up = False, False
    assert [m.address for m in fleet.check()] == [replica.address]
    assert replica.status_calls == 1
    assert fleet.describe()[-1]["state"] == "left: unreachable"


def test_a_member_whose_kept_alive_connection_was_lost_but_answers_stays_and_is_asked_as_others():
    replica = Replica("10.0.0.1:1", keepalive=True)
    fleet = _fleet(replica, heartbeat_s=0.0)
    fleet.max_misses = 3
    replica.connected = True
    fleet.check()
    replica.connected = False
    assert fleet.check() == []  # it answered: no miss
    member = fleet.find(replica.address)
    assert (member.misses, replica.status_calls) == (0, 1)
    replica.up = False  # silent from now on, its connection still down: max_misses beats, as any member
    assert fleet.check() == [] and fleet.check() == []
    assert [m.address for m in fleet.check()] == [replica.address]
