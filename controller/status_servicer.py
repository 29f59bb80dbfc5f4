"""The controller's gRPC service: run status (read by `rlfleet status`) and fleet membership (Join,
Leave: controller/fleet.py). The servicer converts and delegates to the loop's Fleet."""
from __future__ import annotations

import time
from collections.abc import Callable

import structlog

from rlfleet.errors import NotReady, RlfleetError
from rlfleet.proto.v1 import controller_pb2, controller_pb2_grpc
from rlfleet.rpc.errors import rpc_method, status_code_of
from rlfleet.rpc.security import Security
from rlfleet.rpc.server import ServiceServer

SERVICE_NAME = controller_pb2.DESCRIPTOR.services_by_name["Controller"].full_name
JOIN_METHOD = f"/{SERVICE_NAME}/Join"
DEFAULT_DRAIN_S = 60.0  # a Leave without its own timeout: in-flight groups not back by then are handed back
# Every joined replica asks GetRunStatus every 2 s and each reply lists the whole fleet: O(N^2) work a
# second, a quarter of the controller's CPU at N = 256 (issue 34). Calls within this age share one
# reply unless the fleet or the step changed meanwhile (metrics and buffered count may be this old).
REPLY_MAX_AGE_S = 1.0
log = structlog.get_logger(__name__)


class ControllerServicer(controller_pb2_grpc.ControllerServicer):
    role = "controller"

    def __init__(self, run_name: str, services: dict[str, str], loop: Callable[[], object | None]):
        self.run_name = run_name
        self.services = services
        self._loop = loop
        self.metrics = None
        self.last_error = ""
        self._reply: tuple[object, float, controller_pb2.RunStatus] | None = None  # (key, when, reply)

    def _fleet(self):
        loop = self._loop()
        if loop is None:
            raise NotReady("the controller is still starting; join again in a few seconds")
        return loop.fleet

    @rpc_method
    def GetRunStatus(self, request, context):
        loop = self._loop()
        key = (id(loop), getattr(getattr(loop, "fleet", None), "changes", None), getattr(loop, "step", 0))
        cached, now = self._reply, time.monotonic()
        if cached is not None and cached[0] == key and now - cached[1] < REPLY_MAX_AGE_S:
            return cached[2]
        reply = self._run_status(loop)
        self._reply = (key, now, reply)
        return reply

    def _run_status(self, loop) -> controller_pb2.RunStatus:
        last = getattr(loop, "last_metrics", {}) or {}
        described = loop.fleet.describe() if loop is not None else []
        members = [m for m in described if not m["state"].startswith("left")]
        services = {**self.services, **{m["name"]: m["address"] for m in members}}
        if loop is not None:  # replicas that left are no longer the run's
            started = {m["address"] for m in members}
            services = {r: a for r, a in services.items()
                        if not (r == "rollout" or r.startswith("rollout-")) or a in started}
        return controller_pb2.RunStatus(
            run_name=self.run_name, step=getattr(loop, "step", 0),
            policy_version=int(last.get("policy_version", 0)),
            services=[controller_pb2.ServiceEndpoint(role=r, address=a) for r, a in services.items()],
            last_metrics={**{k: float(v) for k, v in last.items() if isinstance(v, (int, float))},
                          **({"controller/buffered_groups": float(loop.buffered())}
                             if loop is not None else {})},
            fleet=[controller_pb2.FleetMember(**m) for m in described],
            environments=[controller_pb2.EnvironmentStatus(**env) for env in [
                getattr(loop, "environment_status", lambda: None)()] if env is not None])

    def Join(self, request, context):
        """Not under rpc_method: a refusal is this one line here and the replica's one line there."""
        loop = self._loop()
        try:
            member = self._fleet().join(request.address, request.name, request.model_identity,
                                        request.model_summary, request.model_architecture)
        except NotReady as exc:  # not a refusal: the replica joins again by itself in a few seconds
            log.info(f"asked rollout replica {request.name or '?'} at {request.address} to join again: {exc}")
            context.abort(status_code_of(exc), str(exc))
        except RlfleetError as exc:
            log.warning(f"refused rollout replica {request.name or '?'} at {request.address}: {exc}")
            context.abort(status_code_of(exc), str(exc))
        return controller_pb2.JoinResponse(run_name=self.run_name, name=member.name,
                                           policy_version=int(getattr(loop, "_rollout_version", 0)))

    @rpc_method
    def Leave(self, request, context):
        fleet = self._fleet()
        member = fleet.leave(request.address, request.timeout_s or DEFAULT_DRAIN_S,
                             request.reason or "drained")
        return controller_pb2.LeaveResponse(finished=member.finished, handed_back=member.handed_back)


def _log_refused(method: str, reason: str) -> None:
    """The controller's line for a replica turned away for its token (its own line says the same)."""
    if method == JOIN_METHOD:
        log.warning(f"refused a rollout replica's Join: {reason} (it must use this job's security.token)")


def start_status_server(host: str, port: int, run_name: str, services: dict[str, str],
                        loop: Callable[[], object | None], security: Security | None = None) -> ServiceServer:
    """Serves the controller's status, fleet membership (and health) on host:port; port 0 picks a free one."""
    server = ServiceServer([SERVICE_NAME], host, port, security=security, on_refused=_log_refused)
    server.add(controller_pb2_grpc.add_ControllerServicer_to_server,
               ControllerServicer(run_name, services, loop))
    server.start()
    server.mark_serving()
    return server
