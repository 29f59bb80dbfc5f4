"""Advantage estimators the controller runs, one group at a time, chosen by ``algorithm.advantage``.

Group estimators need the group, which only the controller has. Estimators that need
token-level quantities (``reinforce_pp``: KL-shaped returns whitened over the batch; ``gae``:
critic values) run in the learner from each sample's reward; for them the controller sends
advantage 0 and the learner fills it in (services/learner/algorithms/advantages.py).
"""
from __future__ import annotations

from collections.abc import Callable

from controller.advantages import group_advantages, rloo_advantages
from rlfleet.registry import Registry

GroupEstimator = Callable[[list[float]], list[float]]
GROUP_ESTIMATORS: Registry[GroupEstimator] = Registry("advantage estimator")


@GROUP_ESTIMATORS.register("grpo")
def grpo(rewards_G: list[float]) -> list[float]:
    """(r - mean) / (std + eps) within the group (Shao et al. 2024)."""
    return group_advantages(rewards_G).tolist()


@GROUP_ESTIMATORS.register("dr_grpo")
def dr_grpo(rewards_G: list[float]) -> list[float]:
    """r - mean, no std division (Liu et al. 2025, "Understanding R1-Zero-like training")."""
    return group_advantages(rewards_G, normalize_std=False).tolist()


@GROUP_ESTIMATORS.register("rloo")
def rloo(rewards_G: list[float]) -> list[float]:
    return rloo_advantages(rewards_G).tolist()


@GROUP_ESTIMATORS.register("reinforce_pp", "gae")
def computed_by_learner(rewards_G: list[float]) -> list[float]:
    return [0.0] * len(rewards_G)
