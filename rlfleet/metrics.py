"""Per-service Prometheus registry and its /metrics HTTP server."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from rlfleet.errors import ConfigError


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
    queue_depth: Gauge

    @classmethod
    def create(cls, role: str) -> "ServiceMetrics":
        reg = CollectorRegistry()
        metrics = cls(
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
            queue_depth=Gauge("rlfleet_queue_depth", "work accepted and not finished: prompts (rollout), "
                              "items (reward), samples (learner), scored groups buffered (controller)",
                              ["service"], registry=reg),
        )
        # Export every per-service series from the start (at 0), not only after its first change.
        for metric in (metrics.in_flight, metrics.policy_version, metrics.weight_sync_seconds, metrics.tokens,
                       metrics.queue_depth):
            metric.labels(role)
        return metrics

    def in_flight_now(self) -> int:
        return int(self.in_flight.labels(self.role)._value.get())

    def policy_version_now(self) -> int:
        return int(self.policy_version.labels(self.role)._value.get())

    @contextmanager
    def queued(self, count: int) -> Iterator[QueuedWork]:
        """Counts `count` units in rlfleet_queue_depth until each is `done()` or the block ends."""
        work = QueuedWork(self.queue_depth.labels(self.role), count)
        try:
            yield work
        finally:
            work.done(work.pending)

    def load_stats(self) -> dict[str, float]:
        """What `rlfleet status` shows as load: queued work and tokens so far."""
        return {"queue_depth": float(self.queue_depth.labels(self.role)._value.get()),
                "tokens": float(self.tokens.labels(self.role)._value.get())}

    def serve(self, host: str, port: int) -> int:
        """Starts the /metrics server; returns the bound port (port 0 picks a free one)."""
        try:
            server, _thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise ConfigError(f"{self.role}.metrics_port: cannot serve /metrics on "
                              f"{host}:{port}: {exc}") from None
        return server.server_port


class QueuedWork:
    """Units of one request still counted in a queue-depth gauge."""

    def __init__(self, gauge, count: int):
        self._gauge, self.pending = gauge, count
        gauge.inc(count)

    def done(self, count: int = 1) -> None:
        count = min(count, self.pending)
        if count > 0:
            self.pending -= count
            self._gauge.dec(count)
