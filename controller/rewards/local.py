"""A reward function run inside the controller, as one of `reward.sources`.

The function (a built-in name or `pkg.module:function`, with the source's
`params`) scores each batch in a worker thread; at most `max_concurrency`
batches at once. A batch that takes longer than `timeout_s` is reported as
failed (the thread is left to finish on its own: Python cannot stop it), and so
is a batch whose request the scorer refuses (e.g. an unknown data_source).
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import structlog

from controller.rewards.remote_client import failed
from controller.rewards.stats import SourceStats
from rlfleet.errors import RlfleetError
from rlfleet.reward_config import RewardSourceConfig
from rlfleet.types import ScoreItem, ScoreResult
from services.reward.scorer import RewardScorer

log = structlog.get_logger(__name__)


class FunctionSource:
    def __init__(self, cfg: RewardSourceConfig):
        self.cfg, self.name, self.weight = cfg, cfg.name, cfg.weight
        self.label = f"reward source {cfg.name!r} (function {cfg.function})"
        self.scorer = RewardScorer(cfg.function, cfg.params)  # a bad spec fails here, before training
        self.stats = SourceStats()
        self._pool = ThreadPoolExecutor(cfg.max_concurrency, thread_name_prefix=f"reward-{cfg.name}")

    def score(self, items: list[ScoreItem]) -> list[ScoreResult]:
        self.stats.add(items=len(items))
        size = self.cfg.batch_size
        futures = [self._pool.submit(self._timed, items[i:i + size]) for i in range(0, len(items), size)]
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
        self.stats.add(errors=sum(not r.ok for r in results))
        return results

    def _timed(self, chunk: list[ScoreItem]) -> list[ScoreResult]:
        started = time.monotonic()
        try:
            return self.scorer.score(chunk)
        finally:
            self.stats.call(time.monotonic() - started)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
