"""Client side: channels to rlfleet services and waiting for them to be ready."""
from __future__ import annotations

import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlfleet.errors import ServiceUnavailable
from rlfleet.rpc.request_id import RequestIdInterceptor
from rlfleet.rpc.security import Security, secure_channel


def open_channel(address: str, security: Security | None = None) -> grpc.Channel:
    """Every call made on it carries a request id (see rlfleet.rpc.request_id), and the bearer token and
    TLS of `security` (None: plain gRPC)."""
    return grpc.intercept_channel(secure_channel(address, security), RequestIdInterceptor())


def health_status(channel: grpc.Channel, service: str = "", timeout_s: float = 2.0) -> str:
    """SERVING / NOT_SERVING / UNKNOWN, or UNREACHABLE when nothing answers."""
    stub = health_pb2_grpc.HealthStub(channel)
    try:
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
    except grpc.RpcError:
        return "UNREACHABLE"
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def wait_until_serving(address: str, role: str, timeout_s: float, alive: callable = lambda: True,
                       security: Security | None = None) -> grpc.Channel:
    """Polls the health service until it says SERVING; raises ServiceUnavailable naming the address."""
    channel = open_channel(address, security)
    deadline = time.monotonic() + timeout_s
    status = "UNREACHABLE"
    while time.monotonic() < deadline:
        status = health_status(channel)
        if status == "SERVING":
            return channel
        if not alive():
            break
        time.sleep(0.2)
    channel.close()
    raise ServiceUnavailable(f"{role} service at {address} is not serving after {timeout_s:.0f}s "
                             f"(health: {status})")
