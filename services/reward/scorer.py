"""Reward core: scores a batch item by item, never inventing a score for a failure."""
from __future__ import annotations

import math

import structlog

from rlfleet.errors import InvalidRequest
from rlfleet.types import ScoreItem, ScoreResult
from services.reward.registry import RewardFn, builtin_functions, load_function

log = structlog.get_logger(__name__)


class RewardScorer:
    def __init__(self, fn_spec: str = "auto"):
        self._fixed: RewardFn | None = None if fn_spec == "auto" else load_function(fn_spec)
        self._by_source = builtin_functions()

    def function_for(self, data_source: str) -> RewardFn:
        if self._fixed is not None:
            return self._fixed
        fn = self._by_source.get(data_source)
        if fn is None:
            raise InvalidRequest(f"no reward function for data_source {data_source!r}; built-in ones: "
                                 f"{sorted(self._by_source)} (or set reward.fn=pkg.module:function)")
        return fn

    def score(self, items: list[ScoreItem]) -> list[ScoreResult]:
        seen: set[str] = set()
        for item in items:
            if item.id in seen:
                raise InvalidRequest(f"duplicate item id {item.id!r} in one score request")
            seen.add(item.id)
        return [self._score_one(item) for item in items]

    def _score_one(self, item: ScoreItem) -> ScoreResult:
        fn = self.function_for(item.data_source)
        try:
            value = fn(item.data_source, item.response, item.ground_truth, item.extra_info)
            if isinstance(value, dict):  # verl allows {"score": x, ...}
                value = value["score"]
            value = float(value)
        except Exception as exc:  # noqa: BLE001 - a user function's failure is reported per item
            log.warning("reward function failed", item=item.id, error=repr(exc))
            return ScoreResult(id=item.id, score=0.0, ok=False, error=f"{type(exc).__name__}: {exc}")
        if not math.isfinite(value):
            return ScoreResult(id=item.id, score=0.0, ok=False, error=f"reward function returned {value}")
        return ScoreResult(id=item.id, score=value, ok=True)
