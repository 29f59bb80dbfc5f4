"""Lifecycle of one rlfleet gRPC server: health, reflection, metrics, SIGTERM.

Health starts NOT_SERVING and flips to SERVING only when the caller says the
model is loaded (`mark_serving`), so a load balancer or `rlfleet run` never
routes work to a service that cannot do it.
"""
from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from concurrent import futures

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from rlfleet.errors import ConfigError
from rlfleet.rpc.malformed import MalformedRequestInterceptor
from rlfleet.rpc.security import Security
from rlfleet.rpc.watch_limit import WatchLimit

log = structlog.get_logger(__name__)

MAX_MESSAGE_BYTES = 512 * 1024 * 1024
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]

# Pings from a client's keepalive (rlfleet.rpc.channel.keepalive_options: every KEEPALIVE_S while a call
# is open) are answered, never counted as abuse: by default a server sends GOAWAY too_many_pings on the
# third ping within 5 minutes without data of its own, which fails every call open on the connection.
PING_POLICY = [("grpc.http2.min_ping_interval_without_data_ms", 1000), ("grpc.http2.max_ping_strikes", 0)]


class ServiceServer:
    def __init__(self, service_names: list[str], host: str, port: int, max_workers: int = 16,
                 security: Security | None = None,
                 on_refused: Callable[[str, str], None] | None = None):
        """`security`: TLS, token and message limit (rlfleet.rpc.security); None: plain gRPC.
        `on_refused(method, reason)`: told of each call refused for its bearer token."""
        self.service_names = service_names
        self.security = security = security or Security()
        # SO_REUSEPORT off: a second server on a taken port must fail, not silently split the clients.
        options = [*security.options, ("grpc.so_reuseport", 0), *PING_POLICY]
        # Watch streams get threads of their own, so they cannot starve the work.
        watches = WatchLimit(security.max_health_watches)
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers + watches.limit),
                                   options=options,
                                   interceptors=[*security.server_interceptors(on_refused), watches,
                                                 MalformedRequestInterceptor()])
        self._health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        reflection.enable_server_reflection(
            [*service_names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
             reflection.SERVICE_NAME], self._server)
        self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        try:
            creds = security.server_credentials()
            self.port = (self._server.add_secure_port(f"{host}:{port}", creds) if creds is not None
                         else self._server.add_insecure_port(f"{host}:{port}"))
        except RuntimeError:  # grpc's own text is about verbosity flags; say what usually went wrong
            self.port = 0
        if self.port == 0:
            raise ConfigError(f"cannot bind {host}:{port}: the port is already in use (another service?) "
                              "or the address is not one of this machine's")
        self.host = host
        self._stopped = threading.Event()
        self._stop_done = threading.Event()  # set once "stopped" is logged

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def add(self, add_fn: Callable[[object, grpc.Server], None], servicer: object) -> None:
        add_fn(servicer, self._server)

    def _set_health(self, status: int) -> None:
        for name in ["", *self.service_names]:
            self._health.set(name, status)

    def start(self) -> None:
        self._server.start()
        log.info("listening", address=self.address)

    def mark_serving(self) -> None:
        self._set_health(health_pb2.HealthCheckResponse.SERVING)
        log.info("serving", address=self.address)

    @property
    def stopped(self) -> threading.Event:
        return self._stopped

    def stop(self, grace_s: float = 5.0) -> None:
        """Refuses new work at once, lets running RPCs finish for `grace_s`."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        try:
            self._server.stop(grace_s).wait()
            log.info("stopped", address=self.address)
        finally:
            self._stop_done.set()

    def install_signal_handlers(self, grace_s: float = 5.0) -> None:
        def handle(signum: int, _frame: object) -> None:
            log.info("signal received", signal=signal.Signals(signum).name)
            threading.Thread(target=self.stop, args=(grace_s,), daemon=True).start()
        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)

    def wait(self) -> None:
        self._server.wait_for_termination()
        # The server can be down before the stopping thread (a daemon, from the signal handler) has
        # logged "stopped"; returning now would let the process exit and lose that line.
        if self._stopped.is_set():
            self._stop_done.wait()
