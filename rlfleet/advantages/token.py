"""The token-level stage of the advantage estimators, which the learner runs over the whole train batch.

The controller computes the group stage (grpo, dr_grpo, rloo: they need the groups) and
sends one advantage per sample; ``broadcast`` spreads it over the sample's tokens. The
estimators that need token-level quantities only the learner has run here on the whole
train batch: ``reinforce_pp`` (whitened returns) and ``gae`` (a learned value baseline).

Token rewards: the sample's reward sits on its last response token; with
``algorithm.kl_in_reward`` every token also gets ``-kl_coef * kl_t``. For the group
estimators the KL penalty enters as its return-to-go, ``A_bt = A_b - sum_{t'>=t} gamma^(t'-t)
kl_coef kl_bt'`` (OpenRLHF's way of combining a sequence baseline with a token penalty).

Rows are prompt + response with the response at a different offset in every row, so every
scan runs right to left over the whole row and only advances on response tokens: padding
after the response leaves the running sums at 0, and prompt positions are masked out.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AdvantageInputs:
    """One micro-batch's share of the train batch."""

    rewards_B: torch.Tensor
    sequence_advantages_B: torch.Tensor  # from the controller (0 for learner-side estimators)
    mask_B_T: torch.Tensor
    kl_penalty_B_T: torch.Tensor | None = None  # kl_coef * kl per token, when kl_in_reward
    values_B_T: torch.Tensor | None = None  # critic values, for gae


@dataclass(frozen=True)
class AdvantageOutputs:
    advantages_B_T: torch.Tensor
    returns_B_T: torch.Tensor | None = None  # value targets, for gae


def token_rewards(rewards_B: torch.Tensor, mask_B_T: torch.Tensor,
                  kl_penalty_B_T: torch.Tensor | None = None) -> torch.Tensor:
    """The sample reward on its last response token, minus the per-token KL penalty."""
    keep_B_T = mask_B_T.bool()
    positions_B_T = torch.arange(mask_B_T.shape[-1], device=mask_B_T.device).expand_as(keep_B_T)
    last_B = torch.where(keep_B_T, positions_B_T, -1).max(dim=-1).values
    rewards_B_T = torch.zeros(mask_B_T.shape, dtype=torch.float32, device=mask_B_T.device)
    rows_B = torch.nonzero(last_B >= 0).squeeze(-1)
    rewards_B_T[rows_B, last_B[rows_B]] = rewards_B[rows_B].float()
    if kl_penalty_B_T is not None:
        rewards_B_T = rewards_B_T - torch.where(keep_B_T, kl_penalty_B_T.float(), 0.0)
    return rewards_B_T


def discounted_returns(rewards_B_T: torch.Tensor, mask_B_T: torch.Tensor, gamma: float) -> torch.Tensor:
    """``G_t = r_t + gamma G_{t+1}`` over response tokens; 0 elsewhere."""
    keep_B_T = mask_B_T.bool()
    running_B = torch.zeros(rewards_B_T.shape[0], dtype=torch.float32, device=rewards_B_T.device)
    returns_B_T = torch.zeros(rewards_B_T.shape, dtype=torch.float32, device=rewards_B_T.device)
    for t in reversed(range(rewards_B_T.shape[-1])):
        running_B = torch.where(keep_B_T[:, t], rewards_B_T[:, t] + gamma * running_B, running_B)
        returns_B_T[:, t] = torch.where(keep_B_T[:, t], running_B, 0.0)
    return returns_B_T


def gae(rewards_B_T: torch.Tensor, values_B_T: torch.Tensor, mask_B_T: torch.Tensor, gamma: float,
        lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016); returns (advantages, returns).

    ``delta_t = r_t + gamma V_{t+1} - V_t`` with ``V`` after the last response token 0,
    ``A_t = delta_t + gamma lam A_{t+1}``, and the value target ``R_t = A_t + V_t``.
    """
    keep_B_T = mask_B_T.bool()
    values = values_B_T.float()
    next_value_B = torch.zeros(rewards_B_T.shape[0], dtype=torch.float32, device=rewards_B_T.device)
    next_adv_B = torch.zeros_like(next_value_B)
    advantages_B_T = torch.zeros(rewards_B_T.shape, dtype=torch.float32, device=rewards_B_T.device)
    for t in reversed(range(rewards_B_T.shape[-1])):
        delta_B = rewards_B_T[:, t] + gamma * next_value_B - values[:, t]
        adv_B = delta_B + gamma * lam * next_adv_B
        next_adv_B = torch.where(keep_B_T[:, t], adv_B, next_adv_B)
        next_value_B = torch.where(keep_B_T[:, t], values[:, t], next_value_B)
        advantages_B_T[:, t] = torch.where(keep_B_T[:, t], adv_B, 0.0)
    returns_B_T = torch.where(keep_B_T, advantages_B_T + values, 0.0)
    return advantages_B_T, returns_B_T


def whiten(values: list[torch.Tensor], masks: list[torch.Tensor], eps: float = 1e-8) -> list[torch.Tensor]:
    """``(x - mean) / (std + eps)`` over the unmasked tokens of all micro-batches together.

    Unbiased std (divisor n - 1), as verl's ``masked_whiten``. Fewer than two tokens, or
    all values equal (checked exactly: a float mean of equal values can be off by an ulp,
    which divided by ``0 + eps`` would be a large spurious advantage) give zeros.
    """
    kept = torch.cat([v.float()[m.bool()] for v, m in zip(values, masks)])
    if kept.numel() < 2 or bool((kept == kept[0]).all()):
        return [torch.zeros_like(v, dtype=torch.float32) for v in values]
    mean, std = kept.mean(), kept.std()
    return [torch.where(m.bool(), (v.float() - mean) / (std + eps), 0.0) for v, m in zip(values, masks)]


def broadcast(batches: list[AdvantageInputs], gamma: float, lam: float) -> list[AdvantageOutputs]:
    """The controller's sequence advantage on every response token (minus the KL penalty's
    return-to-go under kl_in_reward): the token stage of every group estimator."""
    outputs = []
    for b in batches:
        keep_B_T = b.mask_B_T.bool()
        adv_B_T = torch.where(keep_B_T, b.sequence_advantages_B.float().unsqueeze(-1), 0.0)
        if b.kl_penalty_B_T is not None:
            adv_B_T = adv_B_T - discounted_returns(torch.where(keep_B_T, b.kl_penalty_B_T.float(), 0.0),
                                                   b.mask_B_T, gamma)
        outputs.append(AdvantageOutputs(adv_B_T))
    return outputs


def reinforce_pp_advantages(batches: list[AdvantageInputs], gamma: float,
                            lam: float) -> list[AdvantageOutputs]:
    returns = [discounted_returns(token_rewards(b.rewards_B, b.mask_B_T, b.kl_penalty_B_T), b.mask_B_T, gamma)
               for b in batches]
    whitened = whiten(returns, [b.mask_B_T for b in batches])
    return [AdvantageOutputs(a) for a in whitened]


def gae_advantages(batches: list[AdvantageInputs], gamma: float, lam: float) -> list[AdvantageOutputs]:
    pairs = []
    for b in batches:
        assert b.values_B_T is not None, "gae needs critic values"
        pairs.append(gae(token_rewards(b.rewards_B, b.mask_B_T, b.kl_penalty_B_T), b.values_B_T, b.mask_B_T,
                         gamma, lam))
    whitened = whiten([adv for adv, _ in pairs], [b.mask_B_T for b in batches])
    return [AdvantageOutputs(a, returns) for a, (_, returns) in zip(whitened, pairs)]
