"""The controller's Prometheus /metrics: training progress next to the services' own metrics.

Besides the series every service exports (`rlfleet_queue_depth{service="controller"}`
is the number of scored groups waiting to be trained, `rlfleet_policy_version`
the version the last batch was trained against), it exports
`rlfleet_train_step` and `rlfleet_train_metric{metric="reward/mean"}` etc.:
the last metrics.jsonl line, so a dashboard shows the curves live.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from prometheus_client import Gauge, start_http_server

from rlfleet.errors import ConfigError
from rlfleet.metrics import ServiceMetrics

ROLE = "controller"


class ControllerTelemetry:
    def __init__(self) -> None:
        self.metrics = ServiceMetrics.create(ROLE)
        reg = self.metrics.registry
        self.step = Gauge("rlfleet_train_step", "last finished optimizer step", registry=reg)
        self.train_metric = Gauge(
            "rlfleet_train_metric", "value of a metrics.jsonl key at the last step", ["metric"], registry=reg
        )
        self._server = None

    def serve(self, host: str, port: int) -> int:
        """Starts /metrics; returns the bound port (0 picks a free one)."""
        try:
            self._server, _thread = start_http_server(port, addr=host, registry=self.metrics.registry)
        except OSError as exc:
            raise ConfigError(
                f"controller.metrics_port: cannot serve /metrics on {host}:{port}: {exc}"
            ) from None
        return self._server.server_port

    def watch_buffer(self, buffered: Callable[[], int]) -> None:
        self.metrics.queue_depth.labels(ROLE).set_function(buffered)

    def observe_step(self, metrics: dict[str, Any]) -> None:
        self.step.set(metrics["step"])
        self.metrics.policy_version.labels(ROLE).set(metrics["policy_version"])
        for key, value in metrics.items():
            if key in ("step", "policy_version") or isinstance(value, bool):
                continue
            if isinstance(value, (int, float)) and math.isfinite(value):
                self.train_metric.labels(key).set(value)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
