"""Counters of one reward source, read once per training step into metrics.jsonl."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class SourceStats:
    calls: int = 0  # calls that reached the source (each attempt counts)
    items: int = 0  # items asked for
    errors: int = 0  # items the source gave no reward for
    retries: int = 0  # calls repeated after a transient failure
    rejected: int = 0  # items failed at once because the circuit was open
    _latency_sum: float = 0.0
    _latency_max: float = 0.0
    _latency_calls: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def call(self, seconds: float) -> None:
        with self._lock:
            self.calls += 1
            self._latency_sum += seconds
            self._latency_calls += 1
            self._latency_max = max(self._latency_max, seconds)

    def add(self, **counts: int) -> None:
        with self._lock:
            for key, value in counts.items():
                setattr(self, key, getattr(self, key) + value)

    def snapshot(self, prefix: str) -> dict[str, float]:
        """Cumulative counters, and latency over the calls since the previous snapshot."""
        with self._lock:
            mean = self._latency_sum / self._latency_calls if self._latency_calls else 0.0
            out = {f"{prefix}/calls": float(self.calls), f"{prefix}/items": float(self.items),
                   f"{prefix}/errors": float(self.errors), f"{prefix}/retries": float(self.retries),
                   f"{prefix}/rejected": float(self.rejected), f"{prefix}/latency_mean_s": mean,
                   f"{prefix}/latency_max_s": self._latency_max}
            self._latency_sum, self._latency_max, self._latency_calls = 0.0, 0.0, 0
        return out
