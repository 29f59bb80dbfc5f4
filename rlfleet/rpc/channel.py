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
                       security: Security | None = None, check_every_s: float = 1.0) -> grpc.Channel:
    """Waits until the health service says SERVING; raises ServiceUnavailable naming the address.

    Watches the health status (a server stream) rather than polling it, so the wait ends the moment
    the service flips to SERVING; each watch lasts `check_every_s` at most, so that `alive()` (is the
    run still worth waiting for) is asked that often."""
    channel = open_channel(address, security)
    stub = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + timeout_s
    status = "UNREACHABLE"
    while (remaining := deadline - time.monotonic()) > 0:
        stream = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=min(check_every_s, remaining),
                            wait_for_ready=True)  # waits for the port to accept, no retry loop of ours
        try:
            for reply in stream:
                status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
                if status == "SERVING":
                    stream.cancel()
                    return channel
        except grpc.RpcError as exc:
            if exc.code() not in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
                # The watch was refused (too many watches, a proxy without streams): poll instead.
                status = health_status(channel)
                if status == "SERVING":
                    return channel
                time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        if not alive():
            break
    channel.close()
    raise ServiceUnavailable(f"{role} service at {address} is not serving after {timeout_s:.0f}s "
                             f"(health: {status})")
