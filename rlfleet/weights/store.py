"""The learner's TCPStore for a weight group: binding it, reaching it and the addresses involved.

Why not TCPStore alone for clients: see `connect_store`. The group itself (rlfleet.weights.group)
builds its rendezvous and process group on the store these return."""
from __future__ import annotations

import socket
import threading
from datetime import timedelta

import torch.distributed as dist

from rlfleet.errors import InvalidRequest, WeightSyncError  # InvalidRequest is a ValueError

# Reaching the learner's store is one TCP connection; a join request's own timeout (up to
# limits.max_weight_timeout_s) is for the transfer, not for finding the store (issue 22).
STORE_CONNECT_S = 10.0


def local_address_towards(address: str) -> str:
    """This machine's address on the route to `address` (a UDP connect sends nothing)."""
    host, port = split_address(address)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, port or 1))
        return probe.getsockname()[0]


def split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise InvalidRequest(f"weight group address must be 'host:port', got {address!r}")
    return host.strip("[]"), int(port)


def listen_socket(host: str, port: int) -> int:
    """A listening socket bound to `host` only; returns its descriptor, which the store then owns."""
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as TCPStore does; not REUSEPORT
            sock.bind(sockaddr)
            sock.listen(2048)
        except OSError:
            sock.close()
            raise
    except OSError as exc:
        raise WeightSyncError(f"cannot bind the weight store to {host}:{port}: {exc}") from None
    return sock.detach()


def connect_store(address: str, timeout_s: float) -> dist.Store:
    """A client of the learner's TCPStore, or WeightSyncError in one line within ~`timeout_s`.

    Why not TCPStore alone: against a closed port it retries until its timeout and logs a C++
    stack trace per try, and against a port that accepts but never answers (not a store) its
    client was seen waiting for good, whatever its timeout. So a plain TCP connect answers the
    first case at once, and the store is built on a helper thread that is given up on (left to
    end with its socket) in the second."""
    host, port = split_address(address)
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as e:
        reason = e.strerror or type(e).__name__  # "Connection refused", "timed out" (socket.timeout)
        raise WeightSyncError(f"cannot reach weight store at {address}: {reason}") from None
    built: dict[str, object] = {}

    def build() -> None:
        try:
            built["store"] = dist.TCPStore(host, port, None, False, timedelta(seconds=timeout_s))
        except Exception as e:  # DistStoreError, DistNetworkError; C++ frames after the first line
            built["error"] = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__

    helper = threading.Thread(target=build, name=f"weight-store-connect-{address}", daemon=True)
    helper.start()
    helper.join(timeout_s + 1.0)
    if "store" in built:
        return built["store"]  # type: ignore[return-value]
    if "error" in built:
        raise WeightSyncError(f"cannot reach weight store at {address}: {built['error']}")
    raise WeightSyncError(f"cannot reach weight store at {address}: it accepted the connection but did "
                          f"not answer as a weight store within {timeout_s:g}s")


def probe_store(address: str, timeout_s: float = STORE_CONNECT_S) -> None:
    """Checks that a weight store answers at `address` (WeightSyncError in one line if not), for a
    process that joins through others (vLLM's workers): a wrong address fails here, without
    occupying them."""
    connect_store(address, min(timeout_s, STORE_CONNECT_S))
