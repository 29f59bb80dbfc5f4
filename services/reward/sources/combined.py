"""Several reward sources combined with weights: what the reward service scores with under
`reward.sources`.

Every sample is scored by every source (the sources in parallel); its reward is
`sum(weight * score)`, and the per-source scores travel along in
`ScoreResult.components`. A sample that any source could not score fails as a
whole (ok=false, the error names each failing source): the controller excludes it
from training and counts it, never scores it 0 (and stops the run after
`reward.max_consecutive_failures` in a row). Each reply also carries what the call
cost per source (calls, errors, retries, latency, circuit state), which the
controller adds up into its `reward/<source>/…` metrics.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import structlog

from rlfleet.reward_stats import SourceStats
from rlfleet.types import ScoredBatch, ScoreItem, ScoreResult
from services.reward.scorer import ScoringCancelled, check_items
from services.reward.sources.breaker import CLOSED

log = structlog.get_logger(__name__)


class Source(Protocol):
    name: str
    weight: float
    stats: SourceStats  # cumulative over the service's life

    def score(self, items: list[ScoreItem], stats: SourceStats | None = None) -> list[ScoreResult]:
        """`stats`: also counts this call there (a child of `self.stats`)."""
        ...

    def close(self) -> None: ...


class RewardSources:
    def __init__(self, sources: list[Source]):
        if not sources:
            raise ValueError("RewardSources needs at least one source")
        self.sources = sources
        self._pool = ThreadPoolExecutor(len(sources), thread_name_prefix="reward-sources")

    def score(self, items: list[ScoreItem], active=None) -> ScoredBatch:
        """`active()` (the caller is still waiting) is asked before scoring starts."""
        check_items(items)
        if active is not None and not active():
            raise ScoringCancelled("the caller left before scoring started")
        calls = [SourceStats(parent=s.stats) for s in self.sources]
        if len(self.sources) == 1:
            per_source = [self.sources[0].score(items, calls[0])]
        else:
            per_source = list(self._pool.map(lambda s, c: s.score(items, c), self.sources, calls))
        combined = [self._combine(item, [results[k] for results in per_source])
                    for k, item in enumerate(items)]
        failures = sum(not r.ok for r in combined)
        if failures:
            log.warning("samples without a reward", count=failures, of=len(combined),
                        error=next(r.error for r in combined if not r.ok))
        metrics: dict[str, float] = {}
        for source, call in zip(self.sources, calls):
            metrics.update(call.to_wire(source.name))
            breaker = getattr(source, "breaker", None)  # only sources that call a server have one
            metrics[f"{source.name}/circuit_open"] = float(breaker is not None and breaker.state != CLOSED)
        return ScoredBatch(combined, metrics)

    def _combine(self, item: ScoreItem, results: list[ScoreResult]) -> ScoreResult:
        errors = [r.error for r in results if not r.ok]
        if errors:
            return ScoreResult(item.id, 0.0, ok=False, error="; ".join(errors))
        components = {s.name: r.score for s, r in zip(self.sources, results)}
        total = sum(s.weight * r.score for s, r in zip(self.sources, results))
        return ScoreResult(item.id, total, ok=True, components=components)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        for source in self.sources:
            source.close()
