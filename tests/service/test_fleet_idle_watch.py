"""An idle joined replica (no Generate stream open: at S = 1 most wait in the admission queue) is watched by
its channel's keepalive pings, not by a status call a heartbeat (issue 44: at 256 replicas those calls
were a quarter of the controller's GIL time and told it nothing).

The controller's asyncio channel to a member pings it even with no call open
(`grpc.keepalive_permit_without_calls`), so a replica that stops answering loses that connection: frozen
(SIGSTOP) or partitioned, KEEPALIVE_S + KEEPALIVE_TIMEOUT_S after its last word; killed, at once. The
heartbeat then asks it once by a status call and removes it if that fails too. Before, a silent member
was asked every beat and removed after `max_misses` failed calls: max_misses × (heartbeat_s +
heartbeat_timeout_s) = 12 s with the defaults; the keepalive path keeps that bound (8 + 1 + 3 = 12 s).

Real replica processes (the real RolloutServicer behind a real ServiceServer, each status call it
serves written to a file), the controller's own RolloutClient and Fleet; the asyncio channels live on an
event loop of their own, as the controller's generation loop holds them."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from controller.clients import RolloutClient
from controller.fleet import Fleet
from rlfleet.rpc.channel import KEEPALIVE_S, KEEPALIVE_TIMEOUT_S
from tests.e2e.conftest import REPO
from tests.sim_services import holds_within

pytestmark = [pytest.mark.service, pytest.mark.timeout(180)]

HEARTBEAT_S, MAX_MISSES, HEARTBEAT_TIMEOUT_S = 1.0, 3, 3.0  # the fleet's defaults
OLD_BOUND_S = MAX_MISSES * (HEARTBEAT_S + HEARTBEAT_TIMEOUT_S)  # a silent member asked every beat
SLACK_S = 15.0  # a loaded 2-core machine: beats and calls start late

REPLICA = """
import sys
from rlfleet.proto.v1 import rollout_pb2_grpc
from rlfleet.rpc.server import ServiceServer
from services.rollout.servicer import SERVICE_NAME, RolloutServicer

class Counted(RolloutServicer):
    def GetStatus(self, request, context):
        with open(sys.argv[1], "a") as calls:
            calls.write("status\\n")
        return super().GetStatus(request, context)

server = ServiceServer([SERVICE_NAME], "127.0.0.1", 0)
server.add(rollout_pb2_grpc.add_RolloutServicer_to_server, Counted())
server.start()
server.mark_serving()
print("port", server.port, flush=True)
server.wait()
"""


class Replica:
    def __init__(self, calls: Path) -> None:
        self.calls = calls
        self.proc = subprocess.Popen([sys.executable, "-c", REPLICA, str(calls)], cwd=REPO,
                                     stdout=subprocess.PIPE, text=True)
        port = next(int(line.split()[1]) for line in self.proc.stdout if line.startswith("port "))
        self.address = f"127.0.0.1:{port}"

    def status_calls(self) -> int:
        return len(self.calls.read_text().splitlines()) if self.calls.exists() else 0

    def end(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def idle_fleet(tmp_path: Path):
    """`idle_fleet(n)`: n replica processes joined to a Fleet, each member's asyncio channel open on the
    loop (as after its first Generate stream) and READY, no stream open."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    made: list[Replica | RolloutClient] = []

    def connect(address: str) -> RolloutClient:
        made.append(RolloutClient(address, timeout_s=60, connect_timeout_s=10, report_every_s=None,
                                  keepalive=True))
        return made[-1]

    def build(n: int) -> tuple[Fleet, list[Replica]]:
        replicas = [Replica(tmp_path / f"status-{i}") for i in range(n)]
        made.extend(replicas)
        fleet = Fleet([], architecture={"model_type": "qwen2"}, connect=connect, heartbeat_s=HEARTBEAT_S,
                      max_misses=MAX_MISSES, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S)
        for replica in replicas:
            member = fleet.join(replica.address, "", fleet.identity)
            asyncio.run_coroutine_threadsafe(member.client.connect_async(), loop).result(timeout=30)
        return fleet, replicas

    yield build
    for thing in reversed(made):
        thing.end() if isinstance(thing, Replica) else thing.close()
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)


def test_idle_members_on_kept_alive_channels_are_not_asked_their_status(idle_fleet):
    """Before: every beat asked every idle member (4 members × 5 beats = 20 calls)."""
    fleet, replicas = idle_fleet(4)
    fleet.heartbeat_s = 0.0  # no member counts as heard from lately: only the pings can excuse it
    joined_calls = [r.status_calls() for r in replicas]  # the Join's call back
    for _ in range(5):
        assert fleet.check() == []
    assert [r.status_calls() - c for r, c in zip(replicas, joined_calls)] == [0, 0, 0, 0]
    assert len(fleet.live()) == 0 and len(fleet.members()) == 4  # joining, none removed


def _removed_within(fleet: Fleet, replicas: list[Replica], sig: int) -> float:
    """Sends `sig` to the first replica with the heartbeat running; seconds until the fleet removed it
    (the other stays)."""
    stop = threading.Event()
    beat = fleet.watch(stop)
    try:
        victim = fleet.find(replicas[0].address)
        os.kill(replicas[0].proc.pid, sig)
        start = time.monotonic()
        assert victim.gone.wait(OLD_BOUND_S + SLACK_S + KEEPALIVE_S), "not removed"
        took_s = time.monotonic() - start
        assert fleet.describe()[-1] == {**fleet.describe()[-1], "address": replicas[0].address,
                                        "state": "left: unreachable"}
        assert [m.address for m in fleet.members()] == [r.address for r in replicas[1:]]
        # its connection watch ended with its client (closed on removal)
        assert holds_within(lambda: victim.client.connection_watch_done(), 10)
        return took_s
    finally:
        stop.set()
        beat.join(timeout=30)


def test_a_frozen_idle_member_is_removed_within_the_heartbeats_bound(idle_fleet):
    """SIGSTOP: the kernel keeps its connection, only unanswered pings tell; then one status call."""
    fleet, replicas = idle_fleet(2)
    took_s = _removed_within(fleet, replicas, signal.SIGSTOP)
    assert took_s >= KEEPALIVE_TIMEOUT_S - 1, took_s  # its pings went unanswered first (~8 s)
    assert took_s < KEEPALIVE_S + KEEPALIVE_TIMEOUT_S + HEARTBEAT_S + HEARTBEAT_TIMEOUT_S + SLACK_S, took_s


def test_a_killed_idle_member_is_removed_at_the_next_beats(idle_fleet):
    """SIGKILL: its connection closes at once; the status call that follows is refused at once."""
    fleet, replicas = idle_fleet(2)
    took_s = _removed_within(fleet, replicas, signal.SIGKILL)
    assert took_s < OLD_BOUND_S + SLACK_S, took_s


def test_the_connection_watch_ends_with_the_runs_close_of_the_streams(idle_fleet, tmp_path):
    """The run stops: its loop closes each client's asyncio channel (close_streams) and then stops; the
    watch must be over by then, not left pending on a stopped loop."""
    fleet, _ = idle_fleet(1)
    client = fleet.members()[0].client
    loop = client._aio_loop
    assert client.connected and not client.connection_watch_done()
    asyncio.run_coroutine_threadsafe(client.close_streams(), loop).result(timeout=30)
    assert client.connection_watch_done() and not client.connected
