"""Per-token quantities every policy loss is built from: log-probs, entropy, masked means.

Pure torch, no I/O. Shapes are spelled in names: ``B`` sequences, ``T`` tokens
per sequence (response positions, already aligned with their targets), ``V``
vocabulary entries. Every ``mask_B_T`` marks the tokens that count (response
tokens, not prompt or padding); it may be bool or 0/1 numeric.

Numerics: everything is computed in at least float32, whatever the model's
dtype, because log-ratios of nearly equal bf16 log-probs are mostly rounding
noise. Values at masked positions never reach the loss *or its gradient*: they
are replaced with ``torch.where`` (not multiplied by 0, which turns an inf or
NaN in padding into NaN), so garbage in padding cannot poison a step.

``token_logprobs`` and ``token_entropy`` live in ``rlfleet.ops.logprobs`` (the rollout engines
compute behaviour log-probs with the same function) and are re-exported here.

The losses themselves are registered units in ``services/learner/algorithms/``
(policy losses, KL estimators, aggregation modes, off-policy corrections).
"""
from __future__ import annotations

import math

import torch

# Shared with the rollout engines (behaviour log-probs), so they live in the core.
from rlfleet.ops.logprobs import token_entropy, token_logprobs

__all__ = [
    "KL_CLAMP",
    "LOG_RATIO_CLAMP",
    "at_least_fp32",
    "check_same_shape",
    "masked_token_mean",
    "token_entropy",
    "token_logprobs",
]

# Log-ratios are clamped to [-20, 20] before exp (as verl does). e^20 ~ 4.9e8 is
# finite in float32, whereas an unclamped exp can overflow to inf, and the
# backward of exp then multiplies a zero upstream gradient by inf, giving NaN.
# Only |log-ratio| > 20 is affected, i.e. probability ratios beyond ~5e8.
LOG_RATIO_CLAMP = 20.0

# Per-token k3 values are clamped to [-10, 10] (as verl does) so that one token
# whose probability collapsed under the policy cannot dominate the KL term. The
# lower bound is inert (k3 >= 0); clamped tokens get zero KL gradient.
KL_CLAMP = 10.0


def at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    """Upcast half types to float32; keep float32/float64 as they are."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def check_same_shape(**tensors: torch.Tensor) -> None:
    """Raise ValueError naming the arguments if the tensors differ in shape."""
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"shape mismatch: {shapes}")


def masked_token_mean(
    values_B_T: torch.Tensor,
    mask_B_T: torch.Tensor,
    normalizer: float | None = None,
) -> torch.Tensor:
    """Sum of ``values`` over unmasked tokens, divided by a token count.

    ``normalizer=None`` divides by this batch's unmasked-token count (at least
    1, so a fully masked batch gives 0, still attached to the graph). Passing
    the global token count of a batch split into micro-batches makes each call
    return that micro-batch's share of the full-batch token mean, so the shares
    sum to the full-batch mean; a per-micro-batch mean, averaged, would weigh
    tokens in short micro-batches more heavily.
    """
    check_same_shape(values_B_T=values_B_T, mask_B_T=mask_B_T)
    keep_B_T = mask_B_T.bool()
    total = torch.where(keep_B_T, at_least_fp32(values_B_T), 0.0).sum()
    if normalizer is None:
        return total / keep_B_T.sum().clamp(min=1)
    if not normalizer > 0:
        raise ValueError(f"normalizer must be > 0 (a global token count), got {normalizer}")
    return total / normalizer


#: a token counts in mismatch/ratio_over_2 when pi_learner / pi_rollout is above 2 or below 1/2
_LOG_TWO = math.log(2.0)


def mismatch_stats(learner_logprobs_B_T: torch.Tensor, rollout_logprobs_B_T: torch.Tensor,
                   mask_B_T: torch.Tensor) -> dict[str, torch.Tensor]:
    """Training-inference mismatch over the trained tokens: how far the learner's log-probs of the
    sampled tokens are from the ones the rollout sampled them with.

    ``mismatch/kl`` is the k3 estimate of KL(rollout || learner) from the rollout's own samples,
    r - 1 - ln r with r = pi_learner / pi_rollout (non-negative, zero only when the two agree);
    ``mismatch/abs_logprob_diff_mean`` / ``_max`` the absolute log-ratio; ``mismatch/ratio_over_2``
    the share of tokens whose ratio is beyond a factor of 2 either way. Tensors (read once per step)."""
    mask = mask_B_T.bool()
    log_ratio_B_T = torch.where(mask, learner_logprobs_B_T.float() - rollout_logprobs_B_T.float(), 0.0)
    abs_B_T = log_ratio_B_T.abs()
    k3_B_T = torch.expm1(log_ratio_B_T) - log_ratio_B_T
    return {"mismatch/kl": masked_token_mean(k3_B_T, mask),
            "mismatch/abs_logprob_diff_mean": masked_token_mean(abs_B_T, mask),
            "mismatch/abs_logprob_diff_max": abs_B_T.max() if abs_B_T.numel() else abs_B_T.new_zeros(()),
            "mismatch/ratio_over_2": masked_token_mean((abs_B_T > _LOG_TWO).float(), mask)}
