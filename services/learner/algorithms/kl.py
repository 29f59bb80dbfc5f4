"""Per-token estimators of KL(policy || reference) (Schulman, "Approximating KL divergence", 2020).

Each takes the policy's and the reference's log-probs of the sampled tokens and returns a
per-token estimate; with ``d = logp - ref`` (the log of ``p_policy / p_ref``):

* ``k1 = d``: unbiased, high variance, negative on some tokens;
* ``k2 = d^2 / 2``: biased but low variance, never negative; its gradient is the
  gradient of the true KL, which is why it makes a good loss term;
* ``k3 = e^-d + d - 1``: unbiased, never negative, low variance (verl's ``low_var_kl``).

Log-ratios are clamped to ``[-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP]`` and k3 to ``[-KL_CLAMP, KL_CLAMP]``
(as verl does), so one token whose probability collapsed cannot dominate the term.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from services.learner.loss import KL_CLAMP, LOG_RATIO_CLAMP, at_least_fp32, check_same_shape

KLEstimator = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _log_ratio(logprobs_B_T: torch.Tensor, ref_logprobs_B_T: torch.Tensor) -> torch.Tensor:
    check_same_shape(logprobs_B_T=logprobs_B_T, ref_logprobs_B_T=ref_logprobs_B_T)
    return (at_least_fp32(logprobs_B_T) - at_least_fp32(ref_logprobs_B_T)).clamp(-LOG_RATIO_CLAMP,
                                                                                    LOG_RATIO_CLAMP)


def kl_k1(logprobs_B_T: torch.Tensor, ref_logprobs_B_T: torch.Tensor) -> torch.Tensor:
    return _log_ratio(logprobs_B_T, ref_logprobs_B_T)


def kl_k2(logprobs_B_T: torch.Tensor, ref_logprobs_B_T: torch.Tensor) -> torch.Tensor:
    return 0.5 * _log_ratio(logprobs_B_T, ref_logprobs_B_T).square()


def kl_k3(logprobs_B_T: torch.Tensor, ref_logprobs_B_T: torch.Tensor) -> torch.Tensor:
    ref_minus_logp_B_T = -_log_ratio(logprobs_B_T, ref_logprobs_B_T)
    k3_B_T = torch.exp(ref_minus_logp_B_T) - ref_minus_logp_B_T - 1.0
    return k3_B_T.clamp(-KL_CLAMP, KL_CLAMP)
