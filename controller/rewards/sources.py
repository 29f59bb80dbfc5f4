"""Several reward sources combined with weights: what the GRPO loop scores with under `reward.sources`.

Every sample is scored by every source (the sources in parallel); its reward is
`sum(weight * score)`, and the per-source scores travel along in
`ScoreResult.components`. A sample that any source could not score fails as a
whole (ok=false, the error names each failing source): it is excluded from
training and counted, never scored 0. When `max_consecutive_failures` samples in
a row get no reward, scoring raises `RewardError`, which stops the run with the
last error, rather than generating forever for nothing.
"""
from __future__ import annotations

import statistics
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import structlog

from controller.rewards.breaker import CLOSED
from controller.rewards.stats import SourceStats
from rlfleet.errors import RewardError
from rlfleet.types import ScoreItem, ScoreResult

log = structlog.get_logger(__name__)


class Source(Protocol):
    name: str
    weight: float
    stats: SourceStats

    def score(self, items: list[ScoreItem]) -> list[ScoreResult]: ...

    def close(self) -> None: ...


class RewardSources:
    def __init__(self, sources: list[Source], max_consecutive_failures: int = 0):
        if not sources:
            raise ValueError("RewardSources needs at least one source")
        self.sources = sources
        self.max_consecutive_failures = max_consecutive_failures
        self._pool = ThreadPoolExecutor(len(sources), thread_name_prefix="reward-sources")
        self._lock = threading.Lock()
        self.consecutive_failures = 0
        self.excluded = 0  # samples that got no reward, over the whole run

    def score(self, items: list[ScoreItem]) -> list[ScoreResult]:
        if len(self.sources) == 1:
            per_source = [self.sources[0].score(items)]
        else:
            per_source = list(self._pool.map(lambda s: s.score(items), self.sources))
        combined = [self._combine(item, [results[k] for results in per_source]) for k, item in enumerate(items)]
        self._count(combined)
        return combined

    def _combine(self, item: ScoreItem, results: list[ScoreResult]) -> ScoreResult:
        errors = [r.error for r in results if not r.ok]
        if errors:
            return ScoreResult(item.id, 0.0, ok=False, error="; ".join(errors))
        components = {s.name: r.score for s, r in zip(self.sources, results)}
        total = sum(s.weight * r.score for s, r in zip(self.sources, results))
        return ScoreResult(item.id, total, ok=True, components=components)

    def _count(self, results: list[ScoreResult]) -> None:
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
        failures = sum(not r.ok for r in results)
        if failures:
            log.warning("samples left out for want of a reward", count=failures, of=len(results),
                        error=next(r.error for r in results if not r.ok))

    def step_metrics(self, groups: list) -> dict[str, float]:
        """Per source: the mean over the step's scored samples, cumulative counters, recent latency."""
        metrics: dict[str, float] = {"reward/excluded_total": float(self.excluded)}
        results = [r for g in groups for r in g.results if r.ok]
        for source in self.sources:
            prefix = f"reward/{source.name}"
            values = [r.components[source.name] for r in results if source.name in r.components]
            metrics[f"{prefix}/mean"] = float(statistics.fmean(values)) if values else 0.0
            metrics.update(source.stats.snapshot(prefix))
            breaker = getattr(source, "breaker", None)
            metrics[f"{prefix}/circuit_open"] = float(breaker is not None and breaker.state != CLOSED)
        return metrics

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        for source in self.sources:
            source.close()
