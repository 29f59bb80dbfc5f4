"""Builds the reward service's core from `reward`: the reward model when `reward.model.path` is set,
else the rule-based scorer of `reward.fn`."""
from __future__ import annotations

from rlfleet.config import RewardConfig


def build_scorer(cfg: RewardConfig):
    if cfg.model.path:
        from rlfleet.devices import resolve_device, resolve_dtype
        from services.reward.rm import RewardModel

        # With several GPUs the rollout takes the first, the learner the second: the model takes the third.
        device = resolve_device(cfg.model.device, prefer_index=2)
        return RewardModel(cfg.model.path, device, resolve_dtype(cfg.model.dtype, device),
                           cfg.model.batch_size, cfg.model.max_length)
    from services.reward.scorer import RewardScorer
    return RewardScorer(cfg.fn)
