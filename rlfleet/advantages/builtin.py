"""The built-in advantage estimators (rlfleet.advantages). The group stages (run by the controller)
are plain-list math and import no torch; the token stages (run by the learner) import torch when
first run, not here, so that reading the registry (config validation in every process) needs none."""
from __future__ import annotations

from rlfleet.advantages import ADVANTAGE_ESTIMATORS, AdvantageEstimator
# Plain-list math, no torch: imported here once, not inside each call (~0.3 us a group, issue 44)
from rlfleet.advantages.group_lists import group_advantages, rloo_advantages


def grpo(rewards_G: list[float]) -> list[float]:
    """(r - mean) / (std + eps) within the group (Shao et al. 2024)."""
    return group_advantages(rewards_G)


def dr_grpo(rewards_G: list[float]) -> list[float]:
    """r - mean, no std division (Liu et al. 2025, "Understanding R1-Zero-like training")."""
    return group_advantages(rewards_G, normalize_std=False)


def rloo(rewards_G: list[float]) -> list[float]:
    """Leave-one-out baseline (Ahmadian et al. 2024)."""
    return rloo_advantages(rewards_G)


def reinforce_pp(batches, gamma: float, lam: float):
    """Whitened, KL-shaped returns over the batch (Hu 2025)."""
    from rlfleet.advantages.token import reinforce_pp_advantages
    return reinforce_pp_advantages(batches, gamma, lam)


def gae(batches, gamma: float, lam: float):
    """GAE over a learned value baseline (Schulman et al. 2016)."""
    from rlfleet.advantages.token import gae_advantages
    return gae_advantages(batches, gamma, lam)


ADVANTAGE_ESTIMATORS.register("grpo")(AdvantageEstimator(group=grpo))
ADVANTAGE_ESTIMATORS.register("dr_grpo")(AdvantageEstimator(group=dr_grpo))
ADVANTAGE_ESTIMATORS.register("rloo")(AdvantageEstimator(group=rloo))
ADVANTAGE_ESTIMATORS.register("reinforce_pp")(AdvantageEstimator(token=reinforce_pp))
ADVANTAGE_ESTIMATORS.register("gae")(AdvantageEstimator(token=gae, needs_values=True))
