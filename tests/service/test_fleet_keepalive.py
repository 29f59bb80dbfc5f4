"""A joined replica's liveness without a status call a second (issue 44): the controller's channel to it
pings (HTTP/2 keepalive) while a call is open, so a replica that stops answering fails that call within
the keepalive's bound, and rlfleet servers accept those pings.

Real rlfleet servers (rlfleet.rpc.server.ServiceServer): in this process for the ping policy, in a
process of their own for the freeze (SIGSTOP). The open call is a health Watch, a stream that is
quiet after its first message, as a Generate stream is between two groups."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from controller.service_client import translate_rpc_error
from rlfleet.errors import PeerSilent
from rlfleet.rpc.aio_channel import open_aio_channel
from rlfleet.rpc.channel import keepalive_options, open_channel
from rlfleet.rpc.server import ServiceServer
from tests.e2e.conftest import REPO

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]

PING_S = 0.5  # more often than the product's keepalive (grpc sends one a second at most)
PING_TIMEOUT_S = 1.0

SERVER = """
from rlfleet.rpc.server import ServiceServer
server = ServiceServer(["test"], "127.0.0.1", 0)
server.start()
server.mark_serving()
print("port", server.port, flush=True)
server.wait()
"""


def _watch(channel: grpc.Channel, timeout_s: float) -> grpc.RpcError:
    """Opens a health Watch (one message, then quiet) and reads it until it fails; the error."""
    stream = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""),
                                                        timeout=timeout_s)
    next(stream)
    with pytest.raises(grpc.RpcError) as info:
        next(stream)
    return info.value


def test_a_quiet_stream_on_a_kept_alive_channel_is_not_sent_away_for_its_pings():
    """gRPC servers refuse pings more often than every 5 min by default (GOAWAY too_many_pings after the
    third too soon, so at the fourth): the stream would fail UNAVAILABLE ("Too many pings") after ~3 s
    instead of running to its deadline. An rlfleet server takes them."""
    server = ServiceServer(["test"], "127.0.0.1", 0)
    server.start()
    server.mark_serving()
    channel = open_channel(server.address, extra_options=keepalive_options(PING_S, PING_TIMEOUT_S))
    try:
        error = _watch(channel, timeout_s=6.0)  # ~6 pings
        assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED, (error.code(), error.details())
    finally:
        channel.close()
        server.stop(grace_s=0)


def test_an_idle_kept_alive_connection_is_not_sent_away_for_its_pings():
    """With no call open the channel still pings (keepalive_permit_without_calls): the server must take
    those too, or the connection would be closed (GOAWAY too_many_pings) and the fleet would take a
    live idle replica for a lost one (controller/fleet_liveness.py)."""
    server = ServiceServer(["test"], "127.0.0.1", 0)
    server.start()
    server.mark_serving()

    async def idle() -> tuple[grpc.ChannelConnectivity, bool]:
        channel = open_aio_channel(server.address, None, keepalive_options(PING_S, PING_TIMEOUT_S))
        try:
            await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""),
                                                            timeout=30)
            state = channel.get_state()
            try:  # ~12 pings with no call open
                await asyncio.wait_for(channel.wait_for_state_change(state), timeout=6.0)
                changed = True
            except asyncio.TimeoutError:
                changed = False
            return state, changed
        finally:
            await channel.close()
    try:
        state, changed = asyncio.run(idle())
        assert (state, changed) == (grpc.ChannelConnectivity.READY, False)
    finally:
        server.stop(grace_s=0)


def test_a_frozen_server_fails_the_open_stream_within_the_keepalive_bound():
    """SIGSTOP: the process keeps its port and the kernel keeps its connections, so only an answer
    that never comes says it is gone. Without keepalive the stream waits out its deadline (60 s); with
    it, the call fails UNAVAILABLE about PING_S + PING_TIMEOUT_S after the freeze, which the client
    reports as PeerSilent (the fleet's reason `unreachable`)."""
    proc = subprocess.Popen([sys.executable, "-c", SERVER], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        port = next(int(line.split()[1]) for line in proc.stdout if line.startswith("port "))
        channel = open_channel(f"127.0.0.1:{port}", extra_options=keepalive_options(PING_S, PING_TIMEOUT_S))
        stream = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""),
                                                            timeout=60)
        next(stream)  # served: now frozen, with the stream open
        os.kill(proc.pid, signal.SIGSTOP)
        frozen = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            next(stream)
        waited_s = time.monotonic() - frozen
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE, (info.value.code(), info.value.details())
        assert waited_s < 30, waited_s  # ~1.2 s; the deadline would be 60 s
        error = translate_rpc_error("rollout", f"127.0.0.1:{port}", "Generate", info.value)
        assert isinstance(error, PeerSilent), error
        channel.close()
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait()
