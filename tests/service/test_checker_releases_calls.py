"""The conformance checkers leave no gRPC call for the interpreter's final garbage collection.

Issue 32: `rlfleet reward check` against a server without reflection printed its table and then, under
CPU load, sometimes never exited. The optional reflection check opens a stream that such a server
answers with UNIMPLEMENTED; the error a stream raises is its own call object, and its traceback holds
frames that refer back to it, so the call sat in a reference cycle until the final collection at exit.
There grpc's call finaliser waited for a lock that a daemon thread, stopped mid-call at exit, still held.

A call that outlives its check is the defect, whether or not a given exit happens to deadlock: these
tests count the calls still alive (the cyclic collector off, so that a collection by chance cannot hide
one). tests/e2e/test_checker_exit.py runs the real commands under load.
"""
from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from rlfleet.app import env_check, reward_check
from rlfleet.app.conformance import NA
from rlfleet.rpc.channel import wait_until_serving
from tests.plain_servers import server_without_reflection

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]


@contextmanager
def calls_left_alive() -> Iterator[list[grpc.Call]]:
    """Yields a list that, after the block, holds the gRPC calls made in the block and still alive."""
    gc.collect()
    before = {id(obj) for obj in gc.get_objects() if isinstance(obj, grpc.Call)}
    left: list[grpc.Call] = []
    gc.disable()
    try:
        yield left
        left += [obj for obj in gc.get_objects() if isinstance(obj, grpc.Call) and id(obj) not in before]
    finally:
        gc.enable()


@pytest.mark.parametrize("kind, checker", [("reward", reward_check.ContractChecker),
                                           ("env", env_check.EnvContractChecker)])
def test_the_reflection_check_drops_the_refused_stream(kind: str, checker: Callable):
    with server_without_reflection(kind) as address:
        client = checker(address, 10.0)
        try:
            with calls_left_alive() as left:
                assert client.check_reflection() is NA
            assert left == [], f"the refused reflection stream is still alive: {left}"
        finally:
            client.close()
        del left


@pytest.mark.parametrize("kind, check_server", [("reward", reward_check.check_server),
                                                ("env", env_check.check_server)])
def test_a_whole_check_leaves_no_call_behind(kind: str, check_server: Callable):
    with server_without_reflection(kind) as address:
        with calls_left_alive() as left:
            checks = check_server(address, 10.0)
        assert [c.name for c in checks if c.result == "FAIL"] == []
        assert {c.name: c.result for c in checks}["reflection (optional)"] == NA
        assert left == [], f"calls still alive after the check returned: {left}"


def test_waiting_for_a_service_leaves_no_health_watch_behind():
    """wait_until_serving watches health in windows of `check_every_s`; each window that ends without
    SERVING ends its stream with DEADLINE_EXCEEDED, which it catches (the same pattern)."""
    from concurrent import futures

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    status = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(status, server)
    status.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        started = time.monotonic()

        def flip_after_some_windows() -> bool:  # asked after each window: serve once a few have ended
            if time.monotonic() - started > 1.0:
                status.set("", health_pb2.HealthCheckResponse.SERVING)
            return True

        with calls_left_alive() as left:
            channel = wait_until_serving(f"127.0.0.1:{port}", "test", timeout_s=60,
                                         alive=flip_after_some_windows, check_every_s=0.2)
            channel.close()
        assert time.monotonic() - started > 1.0  # windows did end without SERVING
        assert left == [], f"health watches still alive after the wait: {left}"
    finally:
        server.stop(grace=None)


def test_a_failed_generate_stream_is_not_kept_for_the_final_collection():
    """The controller's rollout client turns a failed Generate stream into an rlfleet error; the stream's
    call must go with it (the same pattern, in the process `rlfleet run` ends)."""
    from concurrent import futures

    from controller.clients import RolloutClient
    from rlfleet import types as t
    from rlfleet.errors import ServiceUnavailable
    from rlfleet.proto.v1 import rollout_pb2_grpc

    class Refusing(rollout_pb2_grpc.RolloutServicer):
        def Generate(self, request, context):
            context.abort(grpc.StatusCode.UNAVAILABLE, "going away")
            yield  # a server stream

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    status = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(status, server)
    rollout_pb2_grpc.add_RolloutServicer_to_server(Refusing(), server)
    status.set("", health_pb2.HealthCheckResponse.SERVING)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    client = RolloutClient(f"127.0.0.1:{port}", timeout_s=10.0, connect_timeout_s=30.0)
    try:
        with calls_left_alive() as left:
            with pytest.raises(ServiceUnavailable, match="Generate failed with UNAVAILABLE: going away"):
                list(client.generate([t.PromptRequest("p0", [1, 2, 3])], t.SamplingParams()))
        assert left == [], f"the failed Generate stream is still alive: {left}"
    finally:
        client.close()
        server.stop(grace=None)
