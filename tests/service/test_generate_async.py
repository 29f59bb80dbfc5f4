"""The controller's Generate on its event loop (RolloutClient.generate_async over grpc.aio, issue 44):
the same groups as the blocking call, the same errors (a closed channel is an unreachable service,
naming it), the same channel options (keepalive: a frozen replica fails the open stream as PeerSilent;
TLS and the token: tests/service/test_security.py)."""
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

from controller.clients import RolloutClient
from controller.service_client import translate_rpc_error
from rlfleet.errors import PeerSilent, ServiceUnavailable
from rlfleet.rpc.aio_channel import open_aio_channel
from rlfleet.rpc.channel import keepalive_options
from rlfleet.rpc.request_id import REQUEST_ID, STEP
from rlfleet.types import PromptRequest, SamplingParams
from tests.e2e.conftest import REPO
from tests.service.test_fleet_keepalive import PING_S, PING_TIMEOUT_S, SERVER

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]

PROMPTS = [PromptRequest("p0", [6, 7]), PromptRequest("p1", [8, 9])]
PARAMS = SamplingParams(n=2, max_new_tokens=3)


async def collect(client: RolloutClient) -> list:
    return [group async for group in client.generate_async(PROMPTS, PARAMS)]


def test_generate_async_streams_every_group_of_the_request(rollout_server):
    client = RolloutClient(rollout_server.server.address, timeout_s=30.0, connect_timeout_s=5.0)
    try:
        groups = asyncio.run(collect(client))
        assert sorted(g.request_id for g in groups) == ["p0", "p1"]
        assert all(len(g.completions) == 2 for g in groups)
        assert client.streams == 0 and client.answered > 0
    finally:
        client.close()


@pytest.mark.parametrize("streamed_before", [False, True])
def test_generate_async_on_a_closed_client_is_an_unreachable_service(rollout_server, streamed_before):
    address = rollout_server.server.address
    client = RolloutClient(address, timeout_s=30.0, connect_timeout_s=5.0)

    async def run() -> None:
        if streamed_before:
            assert len(await collect(client)) == 2
        client.close()  # the fleet closes it from another thread; here on the loop: the same call
        with pytest.raises(ServiceUnavailable, match=rf"rollout service at {address}.*closed"):
            await collect(client)

    asyncio.run(run())


def test_a_stream_on_the_aio_channel_carries_the_request_id_the_step_and_the_token():
    """What the channel adds to every call as its metadata (as the blocking channel's
    RequestIdInterceptor and TokenClientInterceptor do), seen by a server."""
    import structlog
    from concurrent.futures import ThreadPoolExecutor

    from rlfleet.rpc.security import Security

    seen: list[dict[str, str]] = []

    def stream(request: bytes, context: grpc.ServicerContext):
        seen.append(dict(context.invocation_metadata()))
        yield b"x"

    server = grpc.server(ThreadPoolExecutor(2))
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "test.Streams", {"Open": grpc.unary_stream_rpc_method_handler(stream)})])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()

    async def call() -> list[bytes]:
        channel = open_aio_channel(f"127.0.0.1:{port}", Security(token="secret"))
        try:
            return [reply async for reply in channel.unary_stream("/test.Streams/Open")(b"", timeout=10)]
        finally:
            await channel.close()

    structlog.contextvars.bind_contextvars(step=7)
    try:
        assert asyncio.run(call()) == [b"x"]
    finally:
        structlog.contextvars.unbind_contextvars("step")
        server.stop(0)
    assert seen[0][STEP] == "7" and len(seen[0][REQUEST_ID]) == 16
    assert seen[0]["authorization"] == "Bearer secret"


def test_a_frozen_server_fails_the_open_aio_stream_as_peer_silent():
    """The keepalive options on an aio channel: SIGSTOP the server with a stream open, and the stream
    fails UNAVAILABLE (ping timeout) within the bound rather than at its 60 s deadline."""
    proc = subprocess.Popen([sys.executable, "-c", SERVER], cwd=REPO, stdout=subprocess.PIPE, text=True)

    async def watch_until_frozen(port: int) -> tuple[grpc.RpcError, float]:
        channel = open_aio_channel(f"127.0.0.1:{port}",
                                   extra_options=keepalive_options(PING_S, PING_TIMEOUT_S))
        try:
            stream = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""),
                                                                timeout=60)
            await stream.read()  # served: now frozen, with the stream open
            os.kill(proc.pid, signal.SIGSTOP)
            frozen = time.monotonic()
            with pytest.raises(grpc.RpcError) as info:
                await stream.read()
            return info.value, time.monotonic() - frozen
        finally:
            await channel.close()

    try:
        port = next(int(line.split()[1]) for line in proc.stdout if line.startswith("port "))
        error, waited_s = asyncio.run(watch_until_frozen(port))
        assert error.code() == grpc.StatusCode.UNAVAILABLE, (error.code(), error.details())
        assert waited_s < 30, waited_s
        assert isinstance(translate_rpc_error("rollout", f"127.0.0.1:{port}", "Generate", error), PeerSilent)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait()


def test_closing_the_client_under_an_open_stream_is_an_unreachable_service():
    """The fleet closes a member's channel from another thread (a drain's timeout, a leave) while its
    task streams: grpc.aio then cancels the call, which must reach the generation task as the replica
    gone (its prompts re-queued), not as the task's own cancellation (the run stopping)."""
    import threading

    from rlfleet.proto.v1 import rollout_pb2_grpc
    from rlfleet.rpc.server import ServiceServer

    released = threading.Event()

    class Silent(rollout_pb2_grpc.RolloutServicer):
        def Generate(self, request, context):  # a replica that takes the request and sends nothing yet
            released.wait(30)
            return iter(())

    server = ServiceServer(["rlfleet.v1.Rollout"], "127.0.0.1", 0)
    server.add(rollout_pb2_grpc.add_RolloutServicer_to_server, Silent())
    server.start()
    server.mark_serving()
    client = RolloutClient(server.address, timeout_s=30.0, connect_timeout_s=5.0)

    async def run() -> None:
        streaming = asyncio.create_task(collect(client))
        while client.streams == 0:  # the call is open
            await asyncio.sleep(0.01)
        threading.Thread(target=client.close).start()
        with pytest.raises(ServiceUnavailable, match=rf"rollout service at {server.address}.*closed"):
            await asyncio.wait_for(streaming, 30)

    try:
        asyncio.run(run())
    finally:
        released.set()
        server.stop(grace_s=0)
