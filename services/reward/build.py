"""Builds the reward service's core from `reward`: the combined `reward.sources` when set, else the
reward model when `reward.model.path` is set, else the rule-based scorer of `reward.fn`."""
from __future__ import annotations

from rlfleet.config import RewardConfig
from rlfleet.rpc.security import Security


def build_own_scorer(cfg: RewardConfig):
    """The service's own core: the reward model, or the rule-based scorer of `reward.fn`."""
    if cfg.model.path:
        from rlfleet.devices import resolve_device, resolve_dtype
        from services.reward.rm import RewardModel

        # With several GPUs the rollout takes the first, the learner the second: the model takes the third.
        device = resolve_device(cfg.model.device, prefer_index=2)
        return RewardModel(cfg.model.path, device, resolve_dtype(cfg.model.dtype, device),
                           cfg.model.batch_size, cfg.model.max_length)
    from services.reward.placement import PlacedScorer
    return PlacedScorer(cfg.fn, isolation=cfg.fn_isolation, workers=cfg.fn_workers,
                        item_timeout_s=cfg.fn_timeout_s)


def build_scorer(cfg: RewardConfig, connect_timeout_s: float = 60.0, security: Security | None = None):
    """`security`: TLS and token of the channels to external reward servers (sources with
    fleet_security); None: plain gRPC."""
    if not cfg.sources:
        return build_own_scorer(cfg)
    from services.reward.sources import build_sources

    own = f"reward.model {cfg.model.path}" if cfg.model.path else f"reward.fn {cfg.fn}"
    return build_sources(cfg.sources, lambda: build_own_scorer(cfg), own, connect_timeout_s, security,
                         fn_workers=cfg.fn_workers, fn_timeout_s=cfg.fn_timeout_s)
