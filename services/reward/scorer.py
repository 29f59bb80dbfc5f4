"""Reward core: scores a batch item by item, never inventing a score for a failure."""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import structlog

from rlfleet.errors import InvalidRequest, RlfleetError
from rlfleet.types import ScoreItem, ScoreResult
from services.reward.registry import (RewardFn, builtin_functions, builtin_name_for, load_function,
                                      named_functions)

log = structlog.get_logger(__name__)


class ScoringCancelled(RlfleetError, TimeoutError):
    """The caller went away (deadline passed or call cancelled) before the batch was scored."""

    grpc_code = "CANCELLED"


def check_items(items: list[ScoreItem]) -> None:
    """The request-level rules of the reward contract: non-empty, unique ids."""
    seen: set[str] = set()
    for item in items:
        if not item.id:
            raise InvalidRequest("a score item has an empty id")
        if item.id in seen:
            raise InvalidRequest(f"duplicate item id {item.id!r} in one score request")
        seen.add(item.id)


def function_extra_info(item: ScoreItem) -> dict[str, Any]:
    """The `extra_info` a reward function gets: the row's, plus `finish_reason` when the request says how
    the response ended ("stop", or "length": cut at the token budget), so a rule can refuse credit to an
    unfinished response. verl's reward managers add run-time facts (num_turns, …) to extra_info the same
    way; the row's own extra_info is never changed."""
    if not item.finish_reason:
        return item.extra_info
    return {**item.extra_info, "finish_reason": item.finish_reason}


class RewardScorer:
    """`fn`: 'auto' (by data_source), a built-in name, 'pkg.module:function', or a callable."""

    def __init__(self, fn: str | RewardFn = "auto", params: dict[str, Any] | None = None):
        if callable(fn):
            self._fixed: RewardFn | None = fn
        else:
            self._fixed = None if fn == "auto" else load_function(fn, params)
        self._by_source = builtin_functions()

    def function_for(self, data_source: str) -> RewardFn:
        if self._fixed is not None:
            return self._fixed
        fn = self._by_source.get(data_source)
        if fn is None and (name := builtin_name_for(data_source)) is not None:
            fn = named_functions()[name]
        if fn is None:
            raise InvalidRequest(f"no reward function for data_source {data_source!r}; built-in ones: "
                                 f"{sorted(self._by_source)}, reasoning_gym/<task> (or set "
                                 "reward.fn=pkg.module:function)")
        return fn

    def score(self, items: list[ScoreItem], active: Callable[[], bool] | None = None) -> list[ScoreResult]:
        """`active()` is asked between items; when it says False the rest is not scored."""
        check_items(items)
        results = []
        for item in items:
            if active is not None and not active():
                raise ScoringCancelled(f"the caller left after {len(results)} of {len(items)} items")
            results.append(self.score_one(item))
        return results

    def score_one(self, item: ScoreItem) -> ScoreResult:
        fn = self.function_for(item.data_source)
        try:
            value = fn(item.data_source, item.response, item.ground_truth, function_extra_info(item))
            if isinstance(value, dict):  # verl allows {"score": x, ...}
                value = value["score"]
            value = float(value)
        except Exception as exc:  # noqa: BLE001 - a user function's failure is reported per item
            log.warning("reward function failed", item=item.id, error=repr(exc))
            return ScoreResult(id=item.id, score=0.0, ok=False, error=f"{type(exc).__name__}: {exc}")
        if not math.isfinite(value):
            return ScoreResult(id=item.id, score=0.0, ok=False, error=f"reward function returned {value}")
        return ScoreResult(id=item.id, score=value, ok=True)
