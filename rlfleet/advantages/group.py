"""Group-relative advantages for GRPO.

GRPO has no value network: the baseline for a completion is the mean reward of
the other completions sampled for the same prompt (its *group*). Normalising by
the group's spread puts every prompt on the same scale, so an easy prompt (all
rewards near 1) and a hard one (all near 0) contribute comparably sized updates.

Standard-deviation convention: we follow verl's ``compute_grpo_outcome_advantage``
and use ``torch.std`` with its default Bessel correction (unbiased, divisor
``G - 1``), plus ``eps`` added to the std (not the variance). For the group
``[1, 0, 0, 1]`` this gives ``±0.5 / sqrt(1/3) = ±0.866`` rather than the
``±1.0`` that the population std (divisor ``G``) would give.

Two deliberate departures from verl, both so a group with no signal cannot
move the policy:

* a group of size 1 gets advantage 0 (verl uses mean 0 / std 1, i.e. the raw
  reward, which would reward a lone sample for an absolute score);
* a group whose rewards are all equal gets exactly 0, checked by equality
  rather than left to arithmetic: the float mean of equal values can differ
  from them by an ulp, and that residue divided by ``0 + eps`` would be a
  spurious advantage of order ``ulp / eps``.

Advantages are computed without autograd: they are constants in the policy loss.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["batch_group_advantages", "group_advantages", "rloo_advantages"]


def _as_reward_tensor(rewards_G: torch.Tensor | Sequence[float]) -> torch.Tensor:
    """Return a detached 1-D floating tensor; rejects non-finite rewards.

    A NaN or inf reward would poison the mean and std of its whole group, so it
    is refused here, where the culprit is still identifiable.
    """
    if isinstance(rewards_G, torch.Tensor):
        rewards = rewards_G.detach()
        if not rewards.is_floating_point():
            rewards = rewards.to(torch.float32)
    else:
        rewards = torch.as_tensor(list(rewards_G), dtype=torch.float32)
    if rewards.dim() != 1:
        raise ValueError(
            f"rewards_G must be 1-D (one reward per completion), got shape {tuple(rewards.shape)}"
        )
    if not torch.isfinite(rewards).all():
        raise ValueError(f"rewards_G contains non-finite values: {rewards.tolist()}")
    return rewards


@torch.no_grad()
def group_advantages(
    rewards_G: torch.Tensor | Sequence[float],
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Advantages for one group of ``G`` completions of the same prompt.

    Returns ``(r - mean(r)) / (std(r) + eps)`` with the unbiased std (see the
    module docstring), or just ``r - mean(r)`` when ``normalize_std`` is False
    (Dr. GRPO style: dividing by the std up-weights prompts whose rewards barely
    differ, which some setups prefer to avoid).

    Groups of size 0 give an empty tensor, size 1 and all-equal groups give
    zeros. The result has the rewards' floating dtype (float32 for lists).
    """
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    rewards = _as_reward_tensor(rewards_G)
    if rewards.numel() <= 1 or bool((rewards == rewards[0]).all()):
        return torch.zeros_like(rewards)
    centred = rewards - rewards.mean()
    if not normalize_std:
        return centred
    return centred / (rewards.std() + eps)


def batch_group_advantages(
    rewards: list[list[float]],
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> list[list[float]]:
    """Apply :func:`group_advantages` to each group; plain lists in and out.

    Groups may differ in size (e.g. after filtering failed rollouts); each is
    normalised only against itself.
    """
    return [group_advantages(group, normalize_std=normalize_std, eps=eps).tolist() for group in rewards]


@torch.no_grad()
def rloo_advantages(rewards_G: torch.Tensor | Sequence[float]) -> torch.Tensor:
    """REINFORCE leave-one-out (Ahmadian et al. 2024): ``r_i - mean_{j != i} r_j``.

    Each sample's baseline is the mean of the *other* samples of its group, so the baseline
    is independent of the sample and the estimate unbiased. Equivalently
    ``G / (G - 1) * (r_i - mean(r))``. Groups of size 0 or 1 (no other sample to compare
    with) and all-equal groups give zeros, as in :func:`group_advantages`.
    """
    rewards = _as_reward_tensor(rewards_G)
    size = rewards.numel()
    if size <= 1 or bool((rewards == rewards[0]).all()):
        return torch.zeros_like(rewards)
    return (rewards - rewards.mean()) * (size / (size - 1))
