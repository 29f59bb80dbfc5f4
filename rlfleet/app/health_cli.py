"""`rlfleet health ADDRESS`: asks a service through the standard gRPC health protocol.

Exit status 0 only when the service answers SERVING; 1 for NOT_SERVING, UNKNOWN,
SERVICE_UNKNOWN or no answer at all. Container health checks (deploy/compose.yaml),
systemd's ExecStartPost and the Slurm script use it, so it imports nothing heavy.

`--wait S` keeps asking until the service is SERVING or S seconds have passed, which
turns "the port is bound" into "the model is loaded". `--pid P` ends the wait as soon as process P
(the service) has exited: systemd's ExecStartPost passes $MAINPID, so a service that failed while
loading fails its unit at once instead of holding it in "activating" for the whole wait.
"""
from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path

SERVING = "SERVING"


def add_parser(sub: argparse._SubParsersAction) -> None:
    health = sub.add_parser("health", help="gRPC health check of one service; exit 0 only when it is SERVING")
    health.add_argument("address", help="HOST:PORT of an rlfleet service (or any gRPC health server)")
    health.add_argument("--service", default="", help="service name to ask about (default: the whole server)")
    health.add_argument("--timeout", type=float, default=3.0, help="deadline of one check, seconds")
    health.add_argument("--wait", type=float, default=0.0, metavar="S",
                        help="keep checking until SERVING, for at most S seconds (default: check once)")
    health.add_argument("--pid", type=int, metavar="PID",
                        help="with --wait: give up as soon as process PID (the service) has exited")
    health.add_argument("--quiet", "-q", action="store_true",
                        help="print nothing; only the exit status tells")
    health.add_argument("--config", "-c", help="job YAML whose `security` section (TLS) to use; health needs "
                        "no token")


def _ask(stub, service: str, timeout_s: float) -> str:
    import grpc
    from grpc_health.v1 import health_pb2

    try:
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
    except grpc.RpcError as exc:
        # The health protocol answers NOT_FOUND for a service name the server does not know.
        return "SERVICE_UNKNOWN" if exc.code() == grpc.StatusCode.NOT_FOUND else "UNREACHABLE"
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def process_alive(pid: int) -> bool:
    """False once `pid` has exited, also while it is a zombie not yet reaped by its parent."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no procfs: os.kill's answer is all there is
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def check(address: str, service: str = "", timeout_s: float = 3.0, wait_s: float = 0.0,
          interval_s: float = 0.5, security=None, alive: Callable[[], bool] | None = None) -> str:
    """The health status name (SERVING, NOT_SERVING, …) or UNREACHABLE; while `wait_s` lasts, asks
    again until it is SERVING, unless `alive()` says the service is gone. `security`: TLS to use
    (rlfleet.rpc.security.Security; None: plain)."""
    from grpc_health.v1 import health_pb2_grpc

    from rlfleet.rpc.channel import open_channel

    deadline = time.monotonic() + wait_s
    with open_channel(address, security) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            status = _ask(stub, service, timeout_s)
            remaining = deadline - time.monotonic()
            if status == SERVING or remaining <= 0 or (alive is not None and not alive()):
                return status
            time.sleep(min(interval_s, remaining))


def run(args: argparse.Namespace, security=None) -> int:
    alive = (lambda: process_alive(args.pid)) if args.pid else None
    status = check(args.address, args.service, args.timeout, args.wait, security=security, alive=alive)
    if not args.quiet:
        print(f"{args.address} {status}", flush=True)
    return 0 if status == SERVING else 1
