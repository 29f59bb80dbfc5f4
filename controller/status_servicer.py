"""The controller's status service, read by `rlfleet status`."""
from __future__ import annotations

from collections.abc import Callable

from rlfleet.proto.v1 import controller_pb2, controller_pb2_grpc
from rlfleet.rpc.errors import rpc_method
from rlfleet.rpc.security import Security
from rlfleet.rpc.server import ServiceServer

SERVICE_NAME = controller_pb2.DESCRIPTOR.services_by_name["Controller"].full_name


class ControllerServicer(controller_pb2_grpc.ControllerServicer):
    role = "controller"

    def __init__(self, run_name: str, services: dict[str, str], loop: Callable[[], object | None]):
        self.run_name = run_name
        self.services = services
        self._loop = loop
        self.metrics = None
        self.last_error = ""

    @rpc_method
    def GetRunStatus(self, request, context):
        loop = self._loop()
        last = getattr(loop, "last_metrics", {}) or {}
        return controller_pb2.RunStatus(
            run_name=self.run_name, step=getattr(loop, "step", 0),
            policy_version=int(last.get("policy_version", 0)),
            services=[controller_pb2.ServiceEndpoint(role=r, address=a) for r, a in self.services.items()],
            last_metrics={**{k: float(v) for k, v in last.items() if isinstance(v, (int, float))},
                          **({"controller/buffered_groups": float(loop.buffered())}
                             if loop is not None else {})})


def start_status_server(host: str, port: int, run_name: str, services: dict[str, str],
                        loop: Callable[[], object | None], security: Security | None = None) -> ServiceServer:
    """Serves the controller's status (and health) on host:port; port 0 picks a free one."""
    server = ServiceServer([SERVICE_NAME], host, port, security=security)
    server.add(controller_pb2_grpc.add_ControllerServicer_to_server,
               ControllerServicer(run_name, services, loop))
    server.start()
    server.mark_serving()
    return server
