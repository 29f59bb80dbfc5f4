"""A rollout replica's side of the elastic fleet: `rlfleet serve rollout --join CONTROLLER_HOST:PORT`.

Once the replica serves, it asks the controller to take it (Join: its address, name and model
identity, with the job's token); the controller gives it the current weights at the next version
boundary, then work. SIGTERM makes it leave cleanly first (Leave: its groups in flight are finished or
handed back, then it is out of the weight group), then it stops. A watcher joins again should the
controller drop it (it was unreachable for a while), and stops the replica once the controller has
been gone for `controller.service_wait_s` (the run ended or failed).
"""
from __future__ import annotations

import json
import signal
import socket
import threading
import time
from pathlib import Path

import grpc
import structlog

from rlfleet.errors import FleetRefused, ServiceUnavailable
from rlfleet.models.identity import architecture, identity_of, model_summary
from rlfleet.proto.v1 import common_pb2, controller_pb2, controller_pb2_grpc
from rlfleet.rpc.channel import FAST_RECONNECT, open_channel
from rlfleet.rpc.security import Security
from rlfleet.rpc.server import ServiceServer
from rlfleet.rpc.service_main import reannounce

log = structlog.get_logger(__name__)

_WILDCARDS = {"0.0.0.0", "::", "[::]", ""}
# RESOURCE_EXHAUSTED: the controller checks other Joins now (controller/fleet.py: MAX_JOIN_CHECKS)
_RETRY = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED}
WATCH_S = 2.0  # how often a joined replica checks that the controller still lists it


def advertised_address(bound: str, advertise: str | None, towards: str | None = None) -> str:
    """The address the controller reaches this replica at: `--advertise HOST[:PORT]`, else the bound one.
    A wildcard bind (0.0.0.0, a container's usual) gives the address of this machine's interface on the
    route to the controller at `towards` (each container of a scaled compose service has its own), else
    this machine's name."""
    host, _, port = bound.rpartition(":")
    if advertise:
        return advertise if ":" in advertise.strip("[]").rsplit("]", 1)[-1] else f"{advertise}:{port}"
    if host not in _WILDCARDS:
        return bound
    return f"{_local_address_towards(towards) if towards else socket.getfqdn()}:{port}"


def _local_address_towards(address: str) -> str:
    """This machine's address on the route to `address` (connecting a UDP socket sends nothing)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host.strip("[]"), int(port) if port.isdigit() else 1))
            return probe.getsockname()[0]
    except OSError:  # no route (yet): the name others may resolve
        return socket.getfqdn()


class FleetMembership:
    def __init__(self, controller: str, security: Security, name: str, model_dir, wait_s: float):
        self.controller = controller
        self.name = name
        self.architecture = architecture(model_dir)
        self.identity, self.summary = identity_of(self.architecture), model_summary(model_dir)
        self.wait_s = wait_s
        # a replica started before its controller joins within a second of it listening
        self._channel = open_channel(controller, security, extra_options=FAST_RECONNECT)
        self._tls = security.tls
        self._stub = controller_pb2_grpc.ControllerStub(self._channel)
        self.address = ""
        self._leaving = threading.Event()

    def _refused(self, err: grpc.RpcError) -> FleetRefused:
        detail = err.details() or err.code().name
        if err.code() == grpc.StatusCode.UNAUTHENTICATED:
            detail += " (start it with the job's security.token)"
        return FleetRefused(f"the controller at {self.controller} refused rollout replica {self.name} at "
                            f"{self.address}: {detail}")

    def join(self, address: str,
             stopped: threading.Event | None = None) -> controller_pb2.JoinResponse | None:
        """Joins, retrying while the controller is unreachable or starting (`wait_s` at most). None when
        `stopped` (the server's: SIGTERM) is set meanwhile: a replica waiting to join stops at once."""
        self.address = address
        stopped = stopped or threading.Event()
        request = controller_pb2.JoinRequest(address=address, name=self.name, model_identity=self.identity,
                                             model_summary=self.summary,
                                             model_architecture=json.dumps(self.architecture))
        deadline, said = time.monotonic() + self.wait_s, 0.0
        while not stopped.is_set():
            try:
                reply = _unless_stopped(self._stub.Join.future(request, timeout=60), stopped)
                if reply is None:
                    return None
                break
            except grpc.RpcError as err:
                if err.code() not in _RETRY:
                    raise self._refused(err) from None
                why = err.details() + _transport_hint(err.details() or "", self._tls)
                if time.monotonic() > deadline:
                    raise ServiceUnavailable(f"rollout replica {self.name}: the controller at "
                                             f"{self.controller} did not take the join within "
                                             f"{self.wait_s:g}s: {why}") from None
                if time.monotonic() - said > 5:
                    log.warning("waiting for the controller", controller=self.controller, error=why)
                    said = time.monotonic()
                stopped.wait(1.0)
        else:
            return None
        self.name = reply.name
        print(f"rlfleet: rollout replica {reply.name} at {address} joined run {reply.run_name} "
              f"(controller {self.controller}); it takes work once it holds the run's weights "
              f"(version {reply.policy_version} or later)", flush=True)
        return reply

    def leave(self, reason: str, timeout_s: float = 0.0) -> None:
        """Leaves the run: returns once the controller has its groups back and it is out of the group."""
        self._leaving.set()
        try:
            reply = self._stub.Leave(controller_pb2.LeaveRequest(address=self.address, reason=reason,
                                                                 timeout_s=timeout_s),
                                     timeout=(timeout_s or 60.0) + 120)
            print(f"rlfleet: rollout replica {self.name} left the run ({reason}): {reply.finished} groups "
                  f"finished, {reply.handed_back} handed back", flush=True)
        except grpc.RpcError as err:
            log.warning("could not leave the run cleanly", controller=self.controller, error=err.details())

    def membership(self) -> str | None:
        """This replica's state as the controller lists it (`live`, `left: drained`, …; "" when not
        listed), None when the controller does not answer."""
        try:
            status = self._stub.GetRunStatus(common_pb2.GetStatusRequest(), timeout=5)
        except grpc.RpcError:
            return None
        return next((m.state for m in status.fleet if m.address == self.address), "")

    def watch(self, server: ServiceServer) -> threading.Thread:
        def run() -> None:
            gone_since = None
            while not server.stopped.wait(WATCH_S):
                if self._leaving.is_set():
                    return
                state = self.membership()
                if state is None:
                    gone_since = gone_since or time.monotonic()
                    if time.monotonic() - gone_since > self.wait_s:
                        print(f"rlfleet: the controller at {self.controller} has been gone for "
                              f"{self.wait_s:g}s; rollout replica {self.name} stops", flush=True)
                        server.stop()
                        return
                    continue
                gone_since = None
                if state == "left: drained":  # `rlfleet fleet drain`: out of the run for good
                    print(f"rlfleet: rollout replica {self.name} was drained from the run; it stops",
                          flush=True)
                    server.stop()
                    return
                if not state or state.startswith("left"):  # dropped (it stopped answering): afresh
                    try:
                        self.join(self.address, server.stopped)
                    except Exception as exc:  # noqa: BLE001 - a later round tries again
                        log.warning("could not join again", error=str(exc))
        thread = threading.Thread(target=run, name="fleet-watch", daemon=True)
        thread.start()
        return thread

    def leave_on_signal(self, server: ServiceServer) -> None:
        """SIGTERM/SIGINT: leave the run (the controller finishes or hands back this replica's groups),
        then stop serving."""
        def handle(signum: int, _frame: object) -> None:
            log.info("signal received; leaving the run", signal=signal.Signals(signum).name)

            def leave_then_stop() -> None:
                if not self._leaving.is_set():
                    self.leave("sigterm")
                server.stop()
            threading.Thread(target=leave_then_stop, daemon=True).start()
        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)

    def close(self) -> None:
        self._channel.close()


def _transport_hint(detail: str, tls: bool) -> str:
    """What a transport failure likely means: a plaintext client gets only "Socket closed" from a TLS
    server (issue 32), a TLS client a handshake error from a plaintext one."""
    lowered = detail.lower()
    if not tls and "socket closed" in lowered:
        return (" (the controller may serve TLS, which this replica does not use: give it the job's "
                "security.tls_* settings)")
    if tls and any(word in lowered for word in ("ssl", "handshake", "certificate", "tls")):
        return " (TLS failed: this replica's security.tls_* settings must match the controller's)"
    return ""


def _unless_stopped(call: grpc.Future, stopped: threading.Event):
    """The call's result (its RpcError raised), or None once `stopped` is set first (the call is then
    cancelled)."""
    done = threading.Event()
    call.add_done_callback(lambda _: done.set())
    while not done.wait(0.2):
        if stopped.is_set():
            call.cancel()
            return None
    return call.result()


def join_when_serving(controller: str, security: Security, name: str, model_dir, wait_s: float,
                      advertise: str | None, run_dir: Path):
    """The `on_serving` hook of `rlfleet serve rollout --join`. The replica's announcement in
    `run_dir`/services/ is given the address it joins with, where `rlfleet status` then finds it."""
    def on_serving(server: ServiceServer) -> None:
        member = FleetMembership(controller, security, name, model_dir, wait_s)
        address = advertised_address(server.address, advertise, towards=controller)
        reannounce(run_dir, name, address)
        if member.join(address, server.stopped) is None:  # SIGTERM while it waited for the controller
            print(f"rlfleet: rollout replica {name} at {address} stopped before it joined the run "
                  f"(controller {controller})", flush=True)
            member.close()
            return
        member.leave_on_signal(server)
        member.watch(server)
    return on_serving
