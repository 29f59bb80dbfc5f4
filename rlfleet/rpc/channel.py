"""Client side: channels to rlfleet services and waiting for them to be ready."""
from __future__ import annotations

import sys
import time

import grpc
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlfleet.errors import ServiceUnavailable
from rlfleet.rpc.call_release import release_call
from rlfleet.rpc.request_id import RequestIdInterceptor
from rlfleet.rpc.security import Security, secure_channel

log = structlog.get_logger(__name__)


# gRPC's reconnect backoff grows to 120 s while a peer refuses connections; a caller that retries on
# its own every second passes these so a peer that starts listening is reached within a second.
FAST_RECONNECT = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
                  ("grpc.max_reconnect_backoff_ms", 1000)]


# A call open on a channel with these options is watched by HTTP/2 keepalive pings: a peer that stops
# answering (a frozen process, a partitioned host: its kernel may still hold the connection) fails it
# UNAVAILABLE ("ping timeout") KEEPALIVE_S + KEEPALIVE_TIMEOUT_S at most after its last word, with no
# Python run on either side (issue 44: a status call a member a second was a quarter of a 256-replica
# controller's CPU). Pings go after KEEPALIVE_S without data, with a call open or not: an idle connection
# is lost the same way (its channel leaves READY), which is how the fleet watches a replica with no
# Generate stream open without asking it (controller/fleet_liveness.py).
# The peer must accept them (rlfleet.rpc.server.PING_POLICY): gRPC servers refuse pings more often than
# every 5 minutes by default (GOAWAY too_many_pings, which fails the calls open).
KEEPALIVE_S = 2.0
KEEPALIVE_TIMEOUT_S = 6.0


def keepalive_options(every_s: float = KEEPALIVE_S, timeout_s: float = KEEPALIVE_TIMEOUT_S
                      ) -> list[tuple[str, object]]:
    """Channel options: a ping after `every_s` without data, with a call open or not, the connection (and
    its calls) failed when one is not answered within `timeout_s`. grpcio 1.85 times a keepalive ping out by
    `grpc.http2.ping_timeout_ms` (60 s by default), not `grpc.keepalive_timeout_ms`: both are set. And a
    client sends at most 2 pings between two of its own data frames unless `max_pings_without_data` is 0
    (a server stream's client sends none after its request)."""
    every_ms, timeout_ms = int(every_s * 1000), int(timeout_s * 1000)
    return [("grpc.keepalive_time_ms", every_ms), ("grpc.keepalive_timeout_ms", timeout_ms),
            ("grpc.http2.ping_timeout_ms", timeout_ms), ("grpc.http2.max_pings_without_data", 0),
            ("grpc.keepalive_permit_without_calls", 1)]


def open_channel(address: str, security: Security | None = None,
                 extra_options: list[tuple[str, object]] | None = None) -> grpc.Channel:
    """Every call made on it carries a request id (see rlfleet.rpc.request_id), and the bearer token and
    TLS of `security` (None: plain gRPC). `extra_options`: more gRPC channel options (FAST_RECONNECT)."""
    return grpc.intercept_channel(secure_channel(address, security, extra_options), RequestIdInterceptor())


def health_status(channel: grpc.Channel, service: str = "", timeout_s: float = 2.0) -> str:
    """SERVING / NOT_SERVING / UNKNOWN, or UNREACHABLE when nothing answers."""
    return health_check(channel, service, timeout_s)[0]


def health_check(channel: grpc.Channel, service: str = "", timeout_s: float = 2.0) -> tuple[str, str]:
    """(status, why it is not SERVING, in a few words: connection refused, TLS failure, not yet serving…)."""
    stub = health_pb2_grpc.HealthStub(channel)
    try:
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
    except grpc.RpcError as err:
        return "UNREACHABLE", _why_unreachable(err, timeout_s)
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return status, "" if status == "SERVING" else f"not yet serving (health: {status})"


def _why_unreachable(err: grpc.RpcError, timeout_s: float) -> str:
    code = err.code() if hasattr(err, "code") else None
    detail = " ".join(((err.details() if hasattr(err, "details") else str(err)) or "").split())
    lowered = detail.lower()
    if "connection refused" in lowered:
        return "connection refused (nothing listens there)"
    if any(word in lowered for word in ("ssl", "tls", "handshake", "certificate")):
        return f"TLS failure: {detail[:200]}"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"no answer within {timeout_s:g}s"
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return "it answers but serves no gRPC health service (not an rlfleet service?)"
    return f"{code.name if code else 'error'}: {detail[:200]}"


# How often a wait says what it waits for (issue 22: a controller pointed at an address where nothing
# listened printed nothing for its whole connect timeout).
REPORT_EVERY_S = 5.0


def wait_until_serving(address: str, role: str, timeout_s: float, alive: callable = lambda: True,
                       security: Security | None = None, report_every_s: float = REPORT_EVERY_S,
                       check_every_s: float = 1.0,
                       extra_options: list[tuple[str, object]] | None = None) -> grpc.Channel:
    """Waits until the health service says SERVING; says every `report_every_s` (on stderr and in the
    log) which role it waits for, where, and the last error; raises ServiceUnavailable naming the same.

    Watches the health status (a server stream) rather than polling it, so the wait ends the moment
    the service flips to SERVING; each watch lasts `check_every_s` at most, so that `alive()` (is the
    run still worth waiting for) is asked, and the reason for waiting checked, that often.
    `extra_options`: more options of the channel it returns (keepalive_options)."""
    channel = open_channel(address, security, extra_options)
    stub = health_pb2_grpc.HealthStub(channel)
    start = time.monotonic()
    deadline = start + timeout_s
    # the first one soon, the others every few seconds; never with report_every_s=inf (a short check)
    next_report = start + (min(report_every_s, 3.0) if report_every_s != float("inf") else report_every_s)
    why = "no answer yet"
    while (remaining := deadline - time.monotonic()) > 0:
        stream = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=min(check_every_s, remaining),
                            wait_for_ready=True)  # waits for the port to accept, no retry loop of ours
        try:
            for reply in stream:
                if health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status) == "SERVING":
                    stream.cancel()
                    return channel
        except grpc.RpcError as err:  # the watch ended (its deadline, or refused): ask why below
            release_call(err)
        status, why = health_check(channel, timeout_s=min(2.0, max(0.1, deadline - time.monotonic())))
        if status == "SERVING":
            return channel
        if not alive():
            break
        now = time.monotonic()
        if now >= next_report:
            print(f"rlfleet: waiting for the {role} service at {address}: {why} "
                  f"({now - start:.0f}s of {timeout_s:g}s)", file=sys.stderr, flush=True)
            log.info("waiting for a service", role=role, address=address, last_error=why,
                     waited_s=round(now - start, 1), timeout_s=timeout_s)
            next_report = now + report_every_s
        if status == "UNREACHABLE":
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))  # refused at once: no busy loop
    channel.close()
    waited_s = time.monotonic() - start
    raise ServiceUnavailable(f"{role} service at {address} is not serving after {waited_s:.0f}s of "
                             f"{timeout_s:g}s: {why}")
