"""A re-form asks no status of a member whose process the controller already knows (issue 44).

WeightSync.open needs two properties of each replica's process (its weight ranks and its placement) and
used to ask every member for its status at every re-form: under churn at 256 replicas that was ~4 % of
the controller's GIL samples. A member's status is now kept with its client (asked at its Join's call
back or at an earlier re-form) and reused while the keepalive-pinged connection it was asked over has
stayed up: the same process is still there, alive. Members without that (a replica the run started with,
whose channel is not kept alive; a connection lost since: a crash, a restart at the same address) are
asked, as before: a dead one fails its status call and is left out before ranks are handed out.

Real rollout servicers (the simulator's engine, whose weight-group rank joins a rendezvous over sockets)
behind in-process gRPC servers, each GetStatus they answer counted; the controller's own Fleet,
RolloutClients (their asyncio channels on an event loop of their own, as the generation loop holds them)
and WeightSync; the real LearnerServicer with the simulator's learner behind it.
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from bench.fleetsim.engine import SimEngine
from bench.fleetsim.gpu_model import GpuModel
from controller.clients import RolloutClient
from controller.fleet import Fleet
from controller.reform import MembersFailed
from controller.weight_sync import WeightSync
from rlfleet.proto.v1 import rollout_pb2_grpc
from rlfleet.rpc.server import ServiceServer
from services.rollout.servicer import SERVICE_NAME as ROLLOUT_SERVICE
from services.rollout.servicer import RolloutServicer
from tests.sim_services import holds_within, sim_learner

pytestmark = [pytest.mark.service, pytest.mark.timeout(180)]

GROUP_TIMEOUT_S = 30.0
CONNECTION_WAIT_S = 30.0  # a connection's loss, or its coming back, as the watch sees it (a loaded machine)


class CountedServicer(RolloutServicer):
    def __init__(self) -> None:
        super().__init__()
        self.status_calls = 0

    def GetStatus(self, request, context):
        self.status_calls += 1
        return super().GetStatus(request, context)


class Replica:
    """A rollout replica process, as the controller sees one: a gRPC server at its address, a servicer
    (new each start: a restart is a new process, with a new `instance`) and an engine."""

    def __init__(self, port: int = 0) -> None:
        self.engine = SimEngine(GpuModel())
        self.servicer = CountedServicer()
        self.servicer.attach(self.engine)
        self.server = ServiceServer([ROLLOUT_SERVICE], "127.0.0.1", port, max_workers=4)
        self.server.add(rollout_pb2_grpc.add_RolloutServicer_to_server, self.servicer)
        self.server.start()
        self.server.mark_serving()
        self.address = self.server.address

    @property
    def status_calls(self) -> int:
        return self.servicer.status_calls

    def crash(self) -> None:
        """Its calls in flight cut, its connections dropped, its weight-group rank gone."""
        self.server.stop(grace_s=0)
        self.engine.close()


@pytest.fixture
def learner(tmp_path: Path):
    with sim_learner(tmp_path) as client:
        yield client


@pytest.fixture
def joined(learner):
    """`joined(n)`: n replicas joined to a Fleet (each asked its status once, by the Join's call back),
    each member's asyncio channel open on the loop (as after its first Generate stream) and READY, and a
    WeightSync over them."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    made: list[Replica | RolloutClient | WeightSync] = []

    def connect(address: str) -> RolloutClient:
        made.append(RolloutClient(address, timeout_s=60, connect_timeout_s=10, report_every_s=None,
                                  keepalive=True))
        return made[-1]

    def build(n: int) -> tuple[Fleet, list[Replica], WeightSync]:
        replicas = [Replica() for _ in range(n)]
        made.extend(replicas)
        fleet = Fleet([], architecture={"model_type": "qwen2"}, connect=connect)
        for replica in replicas:
            member = fleet.join(replica.address, "", fleet.identity)
            asyncio.run_coroutine_threadsafe(member.client.connect_async(), loop).result(timeout=30)
            assert member.client.connected
        sync = WeightSync(learner, [m.client for m in fleet.members()], GROUP_TIMEOUT_S)
        made.append(sync)
        return fleet, replicas, sync

    yield build, made
    for thing in reversed(made):
        thing.crash() if isinstance(thing, Replica) else thing.close()
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)


def _reform(sync: WeightSync, rollouts: list[RolloutClient]) -> None:
    """A re-form as controller/recovery.py runs it: a new group over `rollouts`, version 0 pushed."""
    sync.forget()
    sync.rollouts = rollouts
    sync.open()
    sync.sync(0)


def _wait_for(condition: Callable[[], bool], timeout_s: float = CONNECTION_WAIT_S) -> bool:
    return holds_within(condition, timeout_s)


def test_members_on_kept_alive_channels_are_not_asked_their_status_at_a_reform(joined):
    """Before: every re-form asked every member (3 members x 2 re-forms = 6 calls beyond the Joins')."""
    build, _ = joined
    fleet, replicas, sync = build(3)
    clients = [m.client for m in fleet.members()]
    assert [r.status_calls for r in replicas] == [1, 1, 1]  # the Join's call back
    for _ in range(2):
        _reform(sync, clients)
    assert [r.status_calls for r in replicas] == [1, 1, 1]
    assert [len(r.engine.pulls) for r in replicas] == [2, 2, 2]  # each re-form's group took them all


def test_a_member_without_a_kept_alive_channel_is_asked_at_every_reform(joined):
    """A replica the run started with (rollout.addresses): its channel is not pinged, so nothing but a
    call tells whether it is still there."""
    build, made = joined
    fleet, replicas, sync = build(1)
    founder = Replica()
    made.append(founder)
    client = RolloutClient(founder.address, timeout_s=60, connect_timeout_s=10, report_every_s=None)
    made.append(client)
    for _ in range(2):
        _reform(sync, [client, fleet.members()[0].client])
    assert (founder.status_calls, replicas[0].status_calls) == (2, 1)


def test_a_replica_restarted_at_its_address_is_asked_again(joined):
    """Its connection was lost (the old process crashed) and came back, to a new process: what the
    controller knew of the old one is not taken for the new one's."""
    build, made = joined
    fleet, replicas, sync = build(2)
    clients = [m.client for m in fleet.members()]
    _reform(sync, clients)
    old = replicas[0]
    old.crash()
    assert _wait_for(lambda: not clients[0].connected), "the crash was not seen"
    new = Replica(port=old.server.port)
    made.append(new)
    assert _wait_for(lambda: clients[0].connected), "the connection did not come back"
    _reform(sync, clients)
    assert (new.status_calls, replicas[1].status_calls) == (1, 1)
    assert len(new.engine.pulls) == 1  # it is in the group


def test_a_member_whose_connection_was_lost_is_asked_and_left_out_before_ranks_are_handed_out(joined):
    build, _ = joined
    fleet, replicas, sync = build(2)
    clients = [m.client for m in fleet.members()]
    _reform(sync, clients)
    replicas[1].crash()
    assert _wait_for(lambda: not clients[1].connected), "the crash was not seen"
    sync.forget()
    with pytest.raises(MembersFailed) as failed:
        sync.open()
    assert failed.value.stage == "status" and list(failed.value.failures) == [clients[1]]
    _reform(sync, clients[:1])  # the group re-formed without it, the survivor not asked meanwhile
    assert replicas[0].status_calls == 1
