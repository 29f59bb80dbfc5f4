"""The controller's Join without a token: addresses are checked, the call-back is bounded, and a Join
naming a live member's address does not replace it (issue 32).

The reliability re-run, with no token (the default): 20 Joins naming a dead port made the controller's
health time out for ~30 s (each Join waited 30 s for the address on a server thread);
`localhost`, `127.0.0.1:-1` and an address with a NUL byte were each waited on for 30 s with 281
"waiting" lines; a spoofed Join of the real replica's address replaced it. Now a malformed address is
INVALID_ARGUMENT at once, the call-back waits a few seconds at most on at most a few server threads
(more Joins are refused as busy, and the replica asks again), and a Join for a member that still
answers as the same process keeps that member. A real controller status server and Fleet, and a real
rollout servicer."""
from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from controller.clients import RolloutClient
from controller.fleet import JOIN_CHECK_S, Fleet
from controller.status_servicer import start_status_server
from rlfleet.models.identity import architecture, identity_of
from rlfleet.proto.v1 import controller_pb2, controller_pb2_grpc
from rlfleet.rpc.channel import open_channel
from tests.service.servicer_harness import attach, start, stop

pytestmark = [pytest.mark.service, pytest.mark.timeout(180)]


@pytest.fixture
def controller(tiny_model_dir):
    notes: list[tuple[str, dict]] = []
    fleet = Fleet([], architecture=architecture(tiny_model_dir),
                  connect=lambda address: RolloutClient(address, timeout_s=30, connect_timeout_s=JOIN_CHECK_S,
                                                        report_every_s=None),
                  note=lambda event, **fields: notes.append((event, fields)))
    loop = SimpleNamespace(fleet=fleet, _rollout_version=0)
    server = start_status_server("127.0.0.1", 0, "checks", {}, lambda: loop)
    channel = open_channel(server.address)
    yield SimpleNamespace(stub=controller_pb2_grpc.ControllerStub(channel), channel=channel, fleet=fleet,
                          identity=identity_of(architecture(tiny_model_dir)), notes=notes)
    channel.close()
    for member in fleet.members():
        member.client.close()
    server.stop(grace_s=0)


def _join(ctl, address: str, name: str = "") -> controller_pb2.JoinResponse:
    return ctl.stub.Join(controller_pb2.JoinRequest(address=address, name=name, model_identity=ctl.identity),
                         timeout=60)


@pytest.mark.parametrize("address", ["localhost", "127.0.0.1:-1", "127.0.0.1:0", "127.0.0.1:65536",
                                     "127.0.0.1:50051\x00x", "", "bad host:1", "h" * 300 + ":1", ":50051"])
def test_a_malformed_join_address_is_refused_at_once(controller, address, capfd):
    began = time.monotonic()
    with pytest.raises(grpc.RpcError) as err:
        _join(controller, address)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value
    assert time.monotonic() - began < JOIN_CHECK_S / 3  # at once, not after a call-back of up to 10 s
    assert "waiting for the rollout" not in capfd.readouterr().err
    assert controller.fleet.members() == []


def test_joins_naming_a_dead_port_neither_starve_health_nor_wait_long(controller):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{sock.getsockname()[1]}"  # nothing listens once it is closed
    health = health_pb2_grpc.HealthStub(controller.channel)
    codes: list[grpc.StatusCode] = []
    took: list[float] = []

    def one(_):
        began = time.monotonic()
        try:
            _join(controller, dead)
        except grpc.RpcError as err:
            codes.append(err.code())
        took.append(time.monotonic() - began)

    with ThreadPoolExecutor(20) as pool:
        pending = [pool.submit(one, i) for i in range(20)]
        # A Join refused as busy means every check slot is taken: the Joins are being checked now.
        deadline = time.monotonic() + 30
        while grpc.StatusCode.RESOURCE_EXHAUSTED not in codes:
            assert time.monotonic() < deadline, f"no Join was refused as busy: {codes}"
            time.sleep(0.02)
        for _ in range(3):
            began = time.monotonic()
            assert health.Check(health_pb2.HealthCheckRequest(), timeout=30).status == \
                health_pb2.HealthCheckResponse.SERVING
            # at once, not after a check of up to JOIN_CHECK_S frees a server thread
            assert time.monotonic() - began < JOIN_CHECK_S / 3
        for future in pending:
            future.result()
    assert len(codes) == 20 and set(codes) <= {grpc.StatusCode.FAILED_PRECONDITION,
                                               grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
    assert max(took) < JOIN_CHECK_S + 5, took
    assert controller.fleet.members() == []


def test_a_join_naming_a_live_members_address_keeps_that_member(controller, hf_engine):
    rollout = start("rollout")
    attach("rollout", rollout, hf_engine)
    try:
        address = rollout.server.address
        first = _join(controller, address, "real")
        [member] = controller.fleet.members()
        again = _join(controller, address, "spoof")  # the same process answers at that address
        assert controller.fleet.members() == [member] and not member.gone.is_set()
        assert again.name == first.name == member.name
        assert ("join_repeated", {"replica": address, "name": member.name}) in controller.notes
    finally:
        stop(rollout)

