"""Per-token policy losses, chosen by ``algorithm.policy_loss`` (registered in rlfleet.extensions).

Each returns per-token losses (to be weighted by an aggregation mode and by the
off-policy importance weight) plus per-token flags for metrics. ``old_logprobs`` is
the policy the ratio is taken against: the behaviour (rollout) policy, or the
learner-recomputed old/proximal policy when an off-policy correction asks for it.
Masked positions get log-ratio 0, so padding never reaches ``exp``.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from services.learner.loss import LOG_RATIO_CLAMP, at_least_fp32, check_same_shape

# GSPO's sequence log-ratio is clamped at 10 before exp (as verl does): a whole sequence's
# mean log-ratio beyond 10 means the sample is useless anyway, and e^10 keeps the loss finite.
SEQ_LOG_RATIO_CLAMP = 10.0


@dataclass(frozen=True)
class ClipSettings:
    clip_low: float = 0.2
    clip_high: float = 0.2
    clip_ratio_c: float | None = None  # dual clip; None disables

    def __post_init__(self) -> None:
        if not 0.0 <= self.clip_low < 1.0:
            raise ValueError(f"clip_low must be in [0, 1), got {self.clip_low}")
        if not self.clip_high >= 0.0:
            raise ValueError(f"clip_high must be >= 0, got {self.clip_high}")
        if self.clip_ratio_c is not None and not self.clip_ratio_c > 1.0:
            raise ValueError(f"clip_ratio_c must be > 1, got {self.clip_ratio_c}")


@dataclass(frozen=True)
class PolicyTerms:
    loss_B_T: torch.Tensor  # per-token loss, with gradient
    ratio_B_T: torch.Tensor  # detached ratio the clip looked at
    clipped_B_T: torch.Tensor  # bool: the clipped surrogate was selected
    dual_clipped_B_T: torch.Tensor  # bool: the dual-clip bound was selected


PolicyLoss = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, ClipSettings], PolicyTerms]


def clipped_surrogate(ratio_B_T: torch.Tensor, advantages_B_T: torch.Tensor,
                      clip: ClipSettings) -> PolicyTerms:
    """``max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))``, plus the dual clip for ``A < 0``.

    The max of the two *losses* is PPO's pessimistic bound: the clip only bites when it
    would stop the update from going further where ``A`` already points (``r > 1 + clip_high``
    for ``A > 0``, ``r < 1 - clip_low`` for ``A < 0``); there the gradient is zero. For
    ``A < 0`` the unclipped loss ``-A r`` grows without bound as ``r`` grows; the dual clip
    (Ye et al. 2020) caps it at ``-A c``, so one very off-policy token cannot dominate.
    """
    unclipped_B_T = -advantages_B_T * ratio_B_T
    clipped_B_T = -advantages_B_T * ratio_B_T.clamp(1.0 - clip.clip_low, 1.0 + clip.clip_high)
    loss_B_T = torch.maximum(unclipped_B_T, clipped_B_T)
    dual_B_T = torch.zeros_like(loss_B_T, dtype=torch.bool)
    if clip.clip_ratio_c is not None:
        bound_B_T = -advantages_B_T * clip.clip_ratio_c
        dual_B_T = (advantages_B_T < 0) & (loss_B_T > bound_B_T)
        loss_B_T = torch.where(dual_B_T, bound_B_T, loss_B_T)
    return PolicyTerms(loss_B_T=loss_B_T, ratio_B_T=ratio_B_T.detach(),
                       clipped_B_T=(clipped_B_T > unclipped_B_T).detach(), dual_clipped_B_T=dual_B_T.detach())


def _checked(logprobs_B_T: torch.Tensor, old_logprobs_B_T: torch.Tensor, advantages_B_T: torch.Tensor,
             mask_B_T: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    check_same_shape(logprobs_B_T=logprobs_B_T, old_logprobs_B_T=old_logprobs_B_T,
                     advantages_B_T=advantages_B_T, mask_B_T=mask_B_T)
    return (at_least_fp32(logprobs_B_T), at_least_fp32(old_logprobs_B_T.detach()),
            at_least_fp32(advantages_B_T.detach()), mask_B_T.bool())


def ppo_clip(logprobs_B_T: torch.Tensor, old_logprobs_B_T: torch.Tensor, advantages_B_T: torch.Tensor,
             mask_B_T: torch.Tensor, clip: ClipSettings) -> PolicyTerms:
    """PPO's clipped surrogate on the per-token ratio ``r_t = exp(logp_t - old_t)``."""
    logp, old, adv, keep = _checked(logprobs_B_T, old_logprobs_B_T, advantages_B_T, mask_B_T)
    log_ratio_B_T = torch.where(keep, logp - old, 0.0).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return clipped_surrogate(torch.exp(log_ratio_B_T), adv, clip)


def gspo(logprobs_B_T: torch.Tensor, old_logprobs_B_T: torch.Tensor, advantages_B_T: torch.Tensor,
         mask_B_T: torch.Tensor, clip: ClipSettings) -> PolicyTerms:
    """GSPO (Zheng et al. 2025): one ratio per sequence, the geometric mean of its token ratios.

    ``s_b = exp(mean_t(logp_bt - old_bt))`` is what the clip looks at. Its gradient is spread
    over the tokens with the "GSPO-token" form ``s_bt = sg[s_b] * p_bt / sg[p_bt]``: equal to
    ``s_b`` in value, with ``d s_bt / d logp_bt = s_b``, so aggregated with
    seq-mean-token-mean each token gets ``s_b / n_b`` of its sequence's gradient, as in the paper.
    """
    logp, old, adv, keep = _checked(logprobs_B_T, old_logprobs_B_T, advantages_B_T, mask_B_T)
    tokens_B = keep.sum(dim=-1).clamp(min=1)
    seq_log_ratio_B = (torch.where(keep, logp - old, 0.0).sum(dim=-1) / tokens_B).detach()
    log_ratio_B_T = logp - logp.detach() + seq_log_ratio_B.unsqueeze(-1)
    log_ratio_B_T = torch.where(keep, log_ratio_B_T, 0.0).clamp(max=SEQ_LOG_RATIO_CLAMP)
    return clipped_surrogate(torch.exp(log_ratio_B_T), adv, clip)


def nll(logprobs_B_T: torch.Tensor, old_logprobs_B_T: torch.Tensor, advantages_B_T: torch.Tensor,
        mask_B_T: torch.Tensor, clip: ClipSettings) -> PolicyTerms:
    """Advantage-weighted negative log-likelihood ``-A_t * logp_t``, no ratio and no clip.

    With every advantage 1 this is supervised fine-tuning's loss (`rlfleet sft`: token-mean over the
    response tokens); otherwise it is plain REINFORCE on the current policy's samples. ``old_logprobs``
    are not read (the ratio is reported as 1).
    """
    logp, _, adv, keep = _checked(logprobs_B_T, old_logprobs_B_T, advantages_B_T, mask_B_T)
    loss_B_T = torch.where(keep, -adv * logp, 0.0)
    never_B_T = torch.zeros_like(keep)
    return PolicyTerms(loss_B_T=loss_B_T, ratio_B_T=torch.ones_like(logp), clipped_B_T=never_B_T,
                       dual_clipped_B_T=never_B_T)
