"""Counters of one reward source. The reward service keeps them per source (cumulative, and per Score
call); each Score reply of the combined sources carries the call's counters (`to_wire`), and the
controller adds them up (`merge_wire`) and reads them once per training step into metrics.jsonl
(`snapshot`). Shared by both roles, so it lives in the core."""
from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

COUNTERS = ("calls", "items", "errors", "retries", "rejected")


@dataclass
class SourceStats:
    calls: int = 0  # calls that reached the source (each attempt counts)
    items: int = 0  # items asked for
    errors: int = 0  # items the source gave no reward for
    retries: int = 0  # calls repeated after a transient failure
    rejected: int = 0  # items failed at once because the circuit was open
    parent: SourceStats | None = field(default=None, repr=False, compare=False)  # also counts here
    _latency_sum: float = 0.0
    _latency_max: float = 0.0
    _latency_calls: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def call(self, seconds: float) -> None:
        self._merge(1, seconds, seconds, 1, {})
        if self.parent is not None:
            self.parent.call(seconds)

    def add(self, **counts: int) -> None:
        self._merge(0, 0.0, 0.0, 0, counts)
        if self.parent is not None:
            self.parent.add(**counts)

    def _merge(self, calls: int, latency_sum: float, latency_max: float, latency_calls: int,
               counts: Mapping[str, float]) -> None:
        with self._lock:
            self.calls += calls
            for key, value in counts.items():
                setattr(self, key, getattr(self, key) + int(value))
            self._latency_sum += latency_sum
            self._latency_calls += latency_calls
            self._latency_max = max(self._latency_max, latency_max)

    def to_wire(self, name: str) -> dict[str, float]:
        """The counters as `<name>/<counter>` entries of a Score reply's source_metrics."""
        with self._lock:
            out = {f"{name}/{key}": float(getattr(self, key)) for key in COUNTERS}
            out.update({f"{name}/latency_sum_s": self._latency_sum,
                        f"{name}/latency_max_s": self._latency_max,
                        f"{name}/latency_calls": float(self._latency_calls)})
        return out

    def merge_wire(self, name: str, metrics: Mapping[str, float]) -> None:
        """Adds a Score reply's counters of source `name` (missing entries count 0)."""
        self._merge(0, metrics.get(f"{name}/latency_sum_s", 0.0), metrics.get(f"{name}/latency_max_s", 0.0),
                    int(metrics.get(f"{name}/latency_calls", 0)),
                    {key: metrics.get(f"{name}/{key}", 0) for key in COUNTERS})

    def snapshot(self, prefix: str) -> dict[str, float]:
        """Cumulative counters, and latency over the calls since the previous snapshot."""
        with self._lock:
            mean = self._latency_sum / self._latency_calls if self._latency_calls else 0.0
            out = {f"{prefix}/{key}": float(getattr(self, key)) for key in COUNTERS}
            out.update({f"{prefix}/latency_mean_s": mean, f"{prefix}/latency_max_s": self._latency_max})
            self._latency_sum, self._latency_max, self._latency_calls = 0.0, 0.0, 0
        return out
