"""Reward and environment servers as a third party would write them: the contract and the standard
health service, but no server reflection (reflection is optional; the Node.js examples skip it too).

rlfleet's own servers always serve reflection, so these are what exercises the checkers' "reflection
(optional) N/A" path: a reflection stream that the server answers with UNIMPLEMENTED.
"""
from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from rlfleet.proto.v1 import environment_pb2_grpc, reward_pb2_grpc


def _servicer_adder(kind: str) -> tuple[object, object]:
    if kind == "reward":
        from services.reward.scorer import RewardScorer
        from services.reward.servicer import RewardServicer

        servicer = RewardServicer()
        servicer.attach(RewardScorer("gsm8k"))
        return servicer, reward_pb2_grpc.add_RewardServicer_to_server
    if kind == "env":
        from environments.registry import load_environment
        from environments.servicer import EnvironmentServicer

        return (EnvironmentServicer(load_environment("calculator")),
                environment_pb2_grpc.add_EnvironmentServicer_to_server)
    raise ValueError(f"no plain server of kind {kind!r} (reward, env)")


@contextmanager
def server_without_reflection(kind: str) -> Iterator[str]:
    """A running `kind` server ('reward': the built-in gsm8k reward; 'env': the calculator) on a free
    port, SERVING; yields its HOST:PORT."""
    servicer, add = _servicer_adder(kind)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    status = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(status, server)
    add(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    status.set("", health_pb2.HealthCheckResponse.SERVING)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=1).wait()
        if hasattr(servicer, "close"):
            servicer.close()
