"""The group stage of GRPO, Dr. GRPO and RLOO on plain lists, for the controller.

The same math and conventions as rlfleet.advantages.group (unbiased std, ``eps`` added to the
std, 0 for groups of one and all-equal groups, non-finite rewards refused), without torch: the
controller computes one small group at a time, and importing torch would cost it ~250 MB and a
second of start-up for a few dozen floats. Computed in float64; the proto carries float32.
"""
from __future__ import annotations

import math
import operator
from collections.abc import Sequence

# The checks below run in C (map, list.count) rather than as generator expressions: the controller's
# training thread runs them once a group (issue 44); the values are the same floats either way.


def _checked(rewards_G: Sequence[float]) -> list[float]:
    rewards = list(map(float, rewards_G))
    if not all(map(math.isfinite, rewards)):
        raise ValueError(f"rewards_G contains non-finite values: {rewards}")
    return rewards


def _no_signal(rewards: list[float]) -> bool:
    """All equal (or fewer than two). list.count compares by identity, then ==: the same answer as
    `all(r == rewards[0] ...)` for finite floats (-0.0 == 0.0 either way), which _checked ensured."""
    return len(rewards) <= 1 or rewards.count(rewards[0]) == len(rewards)


def group_advantages(rewards_G: Sequence[float], normalize_std: bool = True,
                     eps: float = 1e-6) -> list[float]:
    """``(r - mean) / (std + eps)`` (unbiased std), or ``r - mean`` when ``normalize_std`` is False."""
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    rewards = _checked(rewards_G)
    if _no_signal(rewards):
        return [0.0] * len(rewards)
    mean = math.fsum(rewards) / len(rewards)
    centred = [r - mean for r in rewards]
    if not normalize_std:
        return centred
    std = math.sqrt(math.fsum(map(operator.mul, centred, centred)) / (len(rewards) - 1))
    return [c / (std + eps) for c in centred]


def rloo_advantages(rewards_G: Sequence[float]) -> list[float]:
    """``r_i - mean_{j != i} r_j`` = ``G / (G - 1) * (r_i - mean)``; 0 for groups of one or all equal."""
    rewards = _checked(rewards_G)
    if _no_signal(rewards):
        return [0.0] * len(rewards)
    size = len(rewards)
    mean = math.fsum(rewards) / size
    return [(r - mean) * (size / (size - 1)) for r in rewards]
