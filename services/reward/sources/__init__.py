"""`reward.sources` composed in the reward service: functions, external reward servers and the
service's own scorer (`reward.fn` or `reward.model`), weighted, with retries and circuit breakers.

The controller only ever talks to the reward service; with `reward.sources` set, this is what the
service scores with (`build_sources`).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlfleet.reward_config import RewardSourceConfig
from rlfleet.rpc.security import Security
from services.reward.sources.combined import RewardSources


def build_sources(sources: list[RewardSourceConfig], own_scorer: Callable[[], Any], own: str,
                  connect_timeout_s: float = 60.0, security: Security | None = None,
                  fn_workers: int = 2, fn_timeout_s: float = 60.0) -> RewardSources:
    """`own_scorer()` builds the service's own core (called once, only when a `service: true`
    source uses it); `own` names it in errors. External servers must answer health within
    `connect_timeout_s`; `security` is the fleet's TLS and token, for sources with fleet_security.
    A function source runs in `fn_workers` worker processes of its own, each item with the deadline
    `fn_timeout_s`, as `reward.fn` does (services/reward/isolation.py)."""
    from services.reward.isolation import IsolatedScorer
    from services.reward.sources.function import FunctionSource
    from services.reward.sources.remote_client import RemoteSource

    built: list = []
    shared: list = []
    try:
        for source in sources:
            if source.function:
                built.append(FunctionSource(source, IsolatedScorer(
                    source.function, source.params, workers=fn_workers, item_timeout_s=fn_timeout_s),
                    owns_scorer=True))
            elif source.service:
                if not shared:
                    shared.append(own_scorer())
                built.append(FunctionSource(source, shared[0], what=f"the reward service's {own}"))
            else:
                built.append(RemoteSource(source, source.address, connect_timeout_s,
                                          security=security or Security()))
    except BaseException:
        for source in built:
            source.close()
        raise
    return RewardSources(built)
