"""A reward function run inside the reward service, as one of `reward.sources`.

The function (a built-in name or `pkg.module:function`, with the source's
`params`, run in worker processes with a deadline per item, as `reward.fn`:
services/reward/isolation.py; or, for a `service: true` source, the service's own
`reward.fn` or `reward.model`) scores each batch from a thread; at most
`max_concurrency` batches at once. An item past its deadline fails alone (its worker
is ended); a batch that takes longer than `timeout_s` as a whole is reported as
failed, and so is a batch whose request the scorer refuses (e.g. an unknown data_source).
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import structlog

from rlfleet.errors import RlfleetError
from rlfleet.reward_config import RewardSourceConfig
from rlfleet.reward_stats import SourceStats
from rlfleet.types import ScoreItem, ScoreResult
from services.reward.scorer import RewardScorer
from services.reward.sources.remote_client import failed

log = structlog.get_logger(__name__)


class FunctionSource:
    def __init__(self, cfg: RewardSourceConfig, scorer=None, what: str | None = None,
                 owns_scorer: bool = False):
        """`scorer`: any core with `score(items)` (an IsolatedScorer of the source's function, or the
        reward service's own, for a `service: true` source), else the source's function in this
        process; `what` says which in errors; `owns_scorer`: close() closes it too."""
        self.cfg, self.name, self.weight = cfg, cfg.name, cfg.weight
        self.label = f"reward source {cfg.name!r} ({what or f'function {cfg.function}'})"
        # a bad function spec fails here, before training
        self.scorer = scorer if scorer is not None else RewardScorer(cfg.function, cfg.params)
        self.owns_scorer = owns_scorer
        self.stats = SourceStats()
        self._pool = ThreadPoolExecutor(cfg.max_concurrency, thread_name_prefix=f"reward-{cfg.name}")

    def score(self, items: list[ScoreItem], stats: SourceStats | None = None) -> list[ScoreResult]:
        stats = stats or SourceStats(parent=self.stats)
        stats.add(items=len(items))
        size = self.cfg.batch_size
        futures = [self._pool.submit(self._timed, items[i:i + size], stats)
                   for i in range(0, len(items), size)]
        results: list[ScoreResult] = []
        for start, future in zip(range(0, len(items), size), futures):
            chunk = items[start:start + size]
            try:
                results.extend(future.result(timeout=self.cfg.timeout_s))
            except FutureTimeout:
                results.extend(failed(chunk, f"{self.label}: no result within {self.cfg.timeout_s:g}s"))
            except RlfleetError as exc:
                results.extend(failed(chunk, f"{self.label}: {type(exc).__name__}: {exc}"))
        results = [r if r.ok else ScoreResult(r.id, 0.0, ok=False, error=r.error if r.error.startswith(
            self.label) else f"{self.label}: {r.error}") for r in results]
        stats.add(errors=sum(not r.ok for r in results))
        return results

    def _timed(self, chunk: list[ScoreItem], stats: SourceStats) -> list[ScoreResult]:
        started = time.monotonic()
        try:
            return self.scorer.score(chunk)
        finally:
            stats.call(time.monotonic() - started)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self.owns_scorer and hasattr(self.scorer, "close"):
            self.scorer.close()
