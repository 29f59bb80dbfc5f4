"""Where each item's reward function runs: in the reward service's own process, or in its worker pool.

A call in the service's process costs microseconds; a call in the pool (services/reward/isolation.py)
costs a round trip to another process per item, and the pool two interpreters of memory. The pool
is what keeps a hung or crashing function from stalling or killing the service, so it stays the
default for code the service cannot vouch for. `reward.fn_isolation`:

* ``auto``: the built-in rules of bounded cost (registry.BOUNDED_BUILTINS) run in-process; every
  other function (``math``'s sympy, your own) in the pool;
* ``process``: every function in the pool;
* ``none``: every function in-process (the user vouches for theirs).

The pool starts with the service whenever `reward.fn` names a function that needs it; under
``reward.fn=auto`` it starts when the first item whose data_source needs it arrives.
"""
from __future__ import annotations

import threading
from typing import Any

from rlfleet.types import ScoreItem, ScoreResult
from services.reward.isolation import IsolatedScorer
from services.reward.registry import is_bounded_builtin
from services.reward.scorer import RewardScorer, ScoringCancelled, check_items


class PlacedScorer:
    def __init__(self, fn: str = "auto", params: dict[str, Any] | None = None, isolation: str = "auto",
                 workers: int = 2, item_timeout_s: float = 60.0):
        if isolation not in ("auto", "process", "none"):
            raise ValueError(f"reward.fn_isolation must be auto, process or none, not {isolation!r}")
        self.fn, self.params, self.isolation = fn, dict(params or {}), isolation
        self.workers, self.item_timeout_s = workers, item_timeout_s
        self.local = RewardScorer(fn, self.params)  # a bad spec fails here, before any worker starts
        self._pool: IsolatedScorer | None = None
        self._pool_lock = threading.Lock()
        fixed = None if fn == "auto" else self.local.function_for("")
        if isolation == "process" or (fixed is not None and self._isolated(fixed)):
            self._start_pool()

    def _isolated(self, function) -> bool:
        if self.isolation == "none":
            return False
        return self.isolation == "process" or not is_bounded_builtin(function)

    def _start_pool(self) -> IsolatedScorer:
        with self._pool_lock:
            if self._pool is None:
                pool = IsolatedScorer(self.fn, self.params, self.workers, self.item_timeout_s)
                pool.start()
                self._pool = pool
            return self._pool

    @property
    def pool_started(self) -> bool:
        return self._pool is not None

    def function_for(self, data_source: str):
        return self.local.function_for(data_source)

    def score(self, items: list[ScoreItem], active=None) -> list[ScoreResult]:
        check_items(items)
        # An unknown data_source is a bad request for the whole batch, before anything is scored.
        isolated = {item.id: self._isolated(self.local.function_for(item.data_source)) for item in items}
        results: dict[str, ScoreResult] = {}
        pooled = [item for item in items if isolated[item.id]]
        for item in items:
            if isolated[item.id]:
                continue
            if active is not None and not active():
                raise ScoringCancelled(f"the caller left after {len(results)} of {len(items)} items")
            results[item.id] = self.local.score_one(item)
        if pooled:
            for result in self._start_pool().score(pooled, active):
                results[result.id] = result
        return [results[item.id] for item in items]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
