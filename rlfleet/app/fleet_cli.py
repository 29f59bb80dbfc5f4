"""`rlfleet fleet drain ADDRESS`: a rollout replica leaves a running job; its groups are finished or handed
back first (controller/fleet.py). The controller is named by --controller HOST:PORT or found in
RUN_DIR/services/controller.json (--run RUN_DIR)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import grpc

from rlfleet.errors import ConfigError, RlfleetError
from rlfleet.proto.v1 import controller_pb2, controller_pb2_grpc
from rlfleet.rpc.channel import open_channel
from rlfleet.rpc.security import Security


def add_parser(sub: argparse._SubParsersAction) -> None:
    fleet = sub.add_parser("fleet", help="the run's rollout fleet: drain a replica "
                           "(see also `rlfleet status`)")
    actions = fleet.add_subparsers(dest="fleet_command", required=True)
    drain = actions.add_parser("drain", help="a replica finishes or hands back its groups, "
                               "then leaves the run")
    drain.add_argument("address", help="the replica's HOST:PORT as `rlfleet status` lists it")
    where = drain.add_mutually_exclusive_group(required=True)
    where.add_argument("--controller", metavar="HOST:PORT", help="the run's controller")
    where.add_argument("--run", metavar="RUN_DIR", help="the run folder (its services/controller.json)")
    drain.add_argument("--timeout", type=float, default=60.0, help="seconds its groups in flight may take "
                       "to finish; the rest are handed back to other replicas (default 60)")
    drain.add_argument("--config", "-c", help="job YAML whose `security` (TLS, token) to use "
                       "(default: RUN_DIR/config.yaml with --run)")


def controller_address(args: argparse.Namespace) -> str:
    if args.controller:
        return args.controller
    path = Path(args.run) / "services" / "controller.json"
    try:
        return json.loads(path.read_text())["address"]
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"--run {args.run}: cannot read the controller's address from {path}: "
                          f"{exc}") from None


def run(args: argparse.Namespace, security: Security) -> int:
    controller = controller_address(args)
    channel = open_channel(controller, security)
    try:
        reply = controller_pb2_grpc.ControllerStub(channel).Leave(
            controller_pb2.LeaveRequest(address=args.address, timeout_s=args.timeout, reason="drained"),
            timeout=args.timeout + 180)
    except grpc.RpcError as err:
        raise RlfleetError(f"the controller at {controller} could not drain {args.address}: "
                           f"{err.details() or err.code().name}") from None
    finally:
        channel.close()
    print(f"rlfleet: {args.address} left the run: {reply.finished} groups finished, "
          f"{reply.handed_back} handed back to other replicas")
    return 0
