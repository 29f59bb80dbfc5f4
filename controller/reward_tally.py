"""What the controller keeps of the reward service's replies under `reward.sources`.

The reward service combines the sources; each Score reply carries the per-source
scores (`ScoreResult.components`) and what the call cost per source. Here they are
added up into the `reward/<source>/…` metrics of each step, the samples that got no
reward are counted (`reward/excluded_total`), and the run is stopped (RewardError)
after `reward.max_consecutive_failures` samples in a row without a reward, rather
than generating forever for nothing.
"""
from __future__ import annotations

import statistics
import threading

from rlfleet.errors import RewardError
from rlfleet.reward_stats import SourceStats
from rlfleet.types import ScoredBatch


class RewardTally:
    def __init__(self, source_names: list[str], max_consecutive_failures: int = 0):
        self.stats = {name: SourceStats() for name in source_names}
        self.circuit_open = dict.fromkeys(source_names, 0.0)
        self.max_consecutive_failures = max_consecutive_failures
        self._lock = threading.Lock()
        self.consecutive_failures = 0
        self.excluded = 0  # samples that got no reward, over the whole run

    def add(self, results: ScoredBatch) -> None:
        """One Score reply; raises RewardError when too many samples in a row got no reward."""
        for name, stats in self.stats.items():
            stats.merge_wire(name, results.source_metrics)
            if f"{name}/circuit_open" in results.source_metrics:
                self.circuit_open[name] = results.source_metrics[f"{name}/circuit_open"]
        with self._lock:
            for r in results:
                if r.ok:
                    self.consecutive_failures = 0
                    continue
                self.excluded += 1
                self.consecutive_failures += 1
                limit = self.max_consecutive_failures
                if limit and self.consecutive_failures >= limit:
                    raise RewardError(f"{self.consecutive_failures} samples in a row got no reward "
                                      f"(reward.max_consecutive_failures={limit}); last error: {r.error}")

    def step_metrics(self, groups: list) -> dict[str, float]:
        """Per source: the mean over the step's scored samples, cumulative counters, recent latency."""
        metrics: dict[str, float] = {"reward/excluded_total": float(self.excluded)}
        results = [r for g in groups for r in g.results if r.ok]
        for name, stats in self.stats.items():
            prefix = f"reward/{name}"
            values = [r.components[name] for r in results if name in r.components]
            metrics[f"{prefix}/mean"] = float(statistics.fmean(values)) if values else 0.0
            metrics.update(stats.snapshot(prefix))
            metrics[f"{prefix}/circuit_open"] = self.circuit_open[name]
        return metrics
