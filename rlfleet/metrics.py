"""Per-service Prometheus registry and its /metrics HTTP server."""
from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


@dataclass
class ServiceMetrics:
    """The metrics every rlfleet service exports, on a registry of its own."""

    role: str
    registry: CollectorRegistry
    rpc_latency: Histogram
    rpc_errors: Counter
    in_flight: Gauge
    policy_version: Gauge
    weight_sync_seconds: Histogram
    tokens: Counter

    @classmethod
    def create(cls, role: str) -> "ServiceMetrics":
        reg = CollectorRegistry()
        return cls(
            role=role,
            registry=reg,
            rpc_latency=Histogram("rlfleet_rpc_latency_seconds", "RPC handling time", ["service", "method"],
                                  registry=reg, buckets=(.005, .02, .1, .5, 1, 2, 5, 10, 30, 120)),
            rpc_errors=Counter("rlfleet_rpc_errors_total", "RPCs that ended in an error",
                               ["service", "method", "code"], registry=reg),
            in_flight=Gauge("rlfleet_rpc_in_flight", "RPCs being handled", ["service"], registry=reg),
            policy_version=Gauge("rlfleet_policy_version", "policy version served or trained",
                                 ["service"], registry=reg),
            weight_sync_seconds=Histogram("rlfleet_weight_sync_seconds", "weight push/pull duration",
                                          ["service"], registry=reg),
            tokens=Counter("rlfleet_tokens_total", "tokens generated (rollout) or trained (learner)",
                           ["service"], registry=reg),
        )

    def in_flight_now(self) -> int:
        return int(self.in_flight.labels(self.role)._value.get())

    def serve(self, host: str, port: int) -> int:
        """Starts the /metrics server; returns the bound port (port 0 picks a free one)."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return server.server_port
