"""The loss of one micro-batch: policy loss x importance weight, KL term, entropy bonus.

    loss = sum_bt w_bt * (is_bt * pg_bt + kl_coef * kl_bt - entropy_coef * H_bt)

with ``w`` the aggregation weights of the mini-batch (see ``aggregation.py``); the KL term is
present only when the KL is a loss term (not ``kl_in_reward``). Every metric is a token mean
over this micro-batch's mask, so weighting them by the micro-batch's share of tokens and
summing gives mini-batch means whatever the aggregation mode.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rlfleet.extensions import KL_ESTIMATORS, POLICY_LOSSES
from services.learner.algorithms.aggregation import weighted_sum
from services.learner.algorithms.off_policy import Correction
from services.learner.algorithms.policy_losses import ClipSettings
from services.learner.loss import masked_token_mean


@dataclass(frozen=True)
class ObjectiveSettings:
    policy_loss: str = "ppo_clip"
    clip: ClipSettings = field(default_factory=ClipSettings)
    kl_coef: float = 0.0  # as a loss term; 0 when the KL is in the reward
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0


@dataclass(frozen=True)
class ObjectiveOutput:
    loss: torch.Tensor
    metrics: dict[str, torch.Tensor]  # detached 0-d token means


def micro_batch_objective(logprobs_B_T: torch.Tensor, advantages_B_T: torch.Tensor, mask_B_T: torch.Tensor,
                          weights_B_T: torch.Tensor, correction: Correction, settings: ObjectiveSettings,
                          ref_logprobs_B_T: torch.Tensor | None = None,
                          entropy_B_T: torch.Tensor | None = None) -> ObjectiveOutput:
    """``entropy_B_T`` must carry gradient when ``entropy_coef > 0``; it is only a metric otherwise."""
    if settings.kl_coef > 0.0 and ref_logprobs_B_T is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs_B_T")
    if settings.entropy_coef > 0.0 and entropy_B_T is None:
        raise ValueError("entropy_coef > 0 needs entropy_B_T")
    terms = POLICY_LOSSES.get(settings.policy_loss)(
        logprobs_B_T, correction.base_logprobs_B_T, advantages_B_T, mask_B_T, settings.clip)
    pg_B_T = terms.loss_B_T * correction.is_weights_B_T
    loss = weighted_sum(pg_B_T, mask_B_T, weights_B_T)

    def mean(values_B_T: torch.Tensor) -> torch.Tensor:
        return masked_token_mean(values_B_T.detach().float(), mask_B_T)

    metrics = {"actor/pg_loss": mean(pg_B_T), "actor/pg_clipfrac": mean(terms.clipped_B_T),
               "actor/pg_clipfrac_lower": mean(terms.dual_clipped_B_T),
               "actor/ratio_mean": mean(terms.ratio_B_T),
               "actor/ppo_kl": mean(correction.base_logprobs_B_T - logprobs_B_T),
               "actor/is_ratio_mean": mean(correction.is_ratio_B_T),
               "actor/is_clipfrac": mean(correction.capped_B_T)}
    if ref_logprobs_B_T is not None:
        kl_B_T = KL_ESTIMATORS.get(settings.kl_estimator)(logprobs_B_T, ref_logprobs_B_T.detach())
        if settings.kl_coef > 0.0:
            loss = loss + settings.kl_coef * weighted_sum(kl_B_T, mask_B_T, weights_B_T)
        metrics["actor/kl_loss"] = mean(kl_B_T)
    else:
        metrics["actor/kl_loss"] = loss.new_zeros(())  # no reference: reported as 0, like verl
    if entropy_B_T is not None:
        if settings.entropy_coef > 0.0:
            loss = loss - settings.entropy_coef * weighted_sum(entropy_B_T, mask_B_T, weights_B_T)
        metrics["actor/entropy"] = mean(entropy_B_T)
    return ObjectiveOutput(loss=loss, metrics=metrics)
