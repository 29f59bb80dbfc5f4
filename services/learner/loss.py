"""GRPO policy loss and the per-token quantities it is built from.

Pure torch, no I/O. Shapes are spelled in names: ``B`` sequences, ``T`` tokens
per sequence (response positions, already aligned with their targets), ``V``
vocabulary entries. Every ``mask_B_T`` marks the tokens that count (response
tokens, not prompt or padding); it may be bool or 0/1 numeric.

Numerics: everything is computed in at least float32, whatever the model's
dtype, because log-ratios of nearly equal bf16 log-probs are mostly rounding
noise. Values at masked positions never reach the loss *or its gradient*: they
are replaced with ``torch.where`` (not multiplied by 0, which turns an inf or
NaN in padding into NaN), so garbage in padding cannot poison a step.

Aggregation is token-mean: every unmasked token in the batch weighs the same,
so long responses are not down-weighted as they are with a per-sequence mean.
When a batch is split into micro-batches for gradient accumulation, pass the
*global* token count as ``normalizer`` to every micro-batch; the micro-batch
losses (and so their gradients) then *sum* to the full-batch values. Metrics in
:class:`LossOutput` ignore ``normalizer``: they are always the call's own token
means, so weighting them by ``micro-batch tokens / global tokens`` and summing
gives the full-batch means.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

__all__ = [
    "LOG_RATIO_CLAMP",
    "KL_CLAMP",
    "LossOutput",
    "token_logprobs",
    "token_entropy",
    "kl_k3",
    "masked_token_mean",
    "grpo_policy_loss",
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


def _at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    """Upcast half types to float32; keep float32/float64 as they are."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _check_same_shape(**tensors: torch.Tensor) -> None:
    """Raise ValueError naming the arguments if the tensors differ in shape."""
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"shape mismatch: {shapes}")


def _check_temperature(temperature: float) -> None:
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


def token_logprobs(
    logits_B_T_V: torch.Tensor,
    targets_B_T: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Log-probability of each target token under ``softmax(logits / temperature)``.

    Use the sampler's temperature: the behaviour log-probs were taken from the
    tempered distribution, so the ratio is only meaningful if ours are too.

    Computed as ``logit[target] - logsumexp(logits)``, one sequence at a time,
    so the float32 copy of the logits and the ``logsumexp`` work space exist for
    one ``T x V`` slice at a time instead of the full ``B x T x V`` tensor
    (a full log_softmax would also materialise a second ``B x T x V`` output).
    Returns ``logprobs_B_T`` in at least float32.
    """
    _check_temperature(temperature)
    if logits_B_T_V.dim() != 3 or logits_B_T_V.shape[:2] != targets_B_T.shape:
        raise ValueError(
            f"expected logits [B, T, V] and targets [B, T], got {tuple(logits_B_T_V.shape)} "
            f"and {tuple(targets_B_T.shape)}"
        )
    out_dtype = torch.promote_types(logits_B_T_V.dtype, torch.float32)
    if logits_B_T_V.shape[0] == 0:
        return logits_B_T_V.new_zeros(targets_B_T.shape, dtype=out_dtype)
    rows_T = []
    for logits_T_V, targets_T in zip(logits_B_T_V, targets_B_T):
        scaled_T_V = logits_T_V.to(out_dtype) / temperature
        target_logit_T = scaled_T_V.gather(-1, targets_T.long().unsqueeze(-1)).squeeze(-1)
        rows_T.append(target_logit_T - torch.logsumexp(scaled_T_V, dim=-1))
    return torch.stack(rows_T)


def token_entropy(logits_B_T_V: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy (nats) of ``softmax(logits / temperature)`` at every position.

    ``H = logsumexp(z) - sum_v p_v z_v``, one sequence at a time for the same
    memory reason as :func:`token_logprobs`. ``-inf`` logits (banned tokens)
    are clamped to the most negative finite float first, so that their
    ``p * z`` term is ``0 * finite = 0`` rather than ``0 * -inf = NaN``.
    Returns ``entropy_B_T`` in at least float32.
    """
    _check_temperature(temperature)
    if logits_B_T_V.dim() != 3:
        raise ValueError(f"expected logits [B, T, V], got {tuple(logits_B_T_V.shape)}")
    out_dtype = torch.promote_types(logits_B_T_V.dtype, torch.float32)
    if logits_B_T_V.shape[0] == 0:
        return logits_B_T_V.new_zeros(logits_B_T_V.shape[:2], dtype=out_dtype)
    lowest = torch.finfo(out_dtype).min
    rows_T = []
    for logits_T_V in logits_B_T_V:
        scaled_T_V = (logits_T_V.to(out_dtype) / temperature).clamp(min=lowest)
        probs_T_V = torch.softmax(scaled_T_V, dim=-1)
        rows_T.append(torch.logsumexp(scaled_T_V, dim=-1) - (probs_T_V * scaled_T_V).sum(dim=-1))
    return torch.stack(rows_T)


def kl_k3(logprobs_B_T: torch.Tensor, ref_logprobs_B_T: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(policy || reference) (Schulman, 2020).

    With ``d = ref - logp`` (a log of ``p_ref / p_policy`` at a token sampled
    from the policy), ``k3 = e^d - d - 1``. It is unbiased for the KL, never
    negative (``e^d >= 1 + d``) and has lower variance than ``-d`` (k1).
    ``d`` is clamped to ``[-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP]`` before exp and
    the result to ``[-KL_CLAMP, KL_CLAMP]``; see those constants for why.
    """
    _check_same_shape(logprobs_B_T=logprobs_B_T, ref_logprobs_B_T=ref_logprobs_B_T)
    log_ratio_B_T = (_at_least_fp32(ref_logprobs_B_T) - _at_least_fp32(logprobs_B_T)).clamp(
        -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP
    )
    k3_B_T = torch.exp(log_ratio_B_T) - log_ratio_B_T - 1.0
    return k3_B_T.clamp(-KL_CLAMP, KL_CLAMP)


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
    _check_same_shape(values_B_T=values_B_T, mask_B_T=mask_B_T)
    keep_B_T = mask_B_T.bool()
    total = torch.where(keep_B_T, _at_least_fp32(values_B_T), 0.0).sum()
    if normalizer is None:
        return total / keep_B_T.sum().clamp(min=1)
    if not normalizer > 0:
        raise ValueError(f"normalizer must be > 0 (a global token count), got {normalizer}")
    return total / normalizer


@dataclass(frozen=True)
class LossOutput:
    """Loss to backpropagate plus detached 0-d metric tensors.

    Metrics stay tensors (``float(out.pg_clipfrac)`` works) so a caller on GPU
    can fetch them all in one transfer instead of syncing once per metric.
    Metrics are token means over *this call's* mask whatever ``normalizer`` is,
    so ``pg_clipfrac`` is always a fraction and ``pg_loss`` is comparable across
    micro-batches; ``loss`` alone is scaled by ``normalizer``. (Hence
    ``loss == pg_loss + kl_coef * kl_loss`` only when ``normalizer`` is None or
    equals the call's token count.)
    """

    loss: torch.Tensor
    pg_loss: torch.Tensor
    kl_loss: torch.Tensor
    pg_clipfrac: torch.Tensor
    ratio_mean: torch.Tensor
    logprob_diff_mean: torch.Tensor

    def metrics(self) -> dict[str, float]:
        """Every field except ``loss``, as Python floats."""
        return {f.name: float(getattr(self, f.name)) for f in fields(self) if f.name != "loss"}


def grpo_policy_loss(
    logprobs_B_T: torch.Tensor,
    behaviour_logprobs_B_T: torch.Tensor,
    advantages_B: torch.Tensor,
    mask_B_T: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    ref_logprobs_B_T: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    normalizer: float | None = None,
) -> LossOutput:
    """PPO clipped surrogate with sequence-level GRPO advantages, token-mean.

    Per token, with ``r = exp(logp - logp_behaviour)`` and the sequence's
    advantage ``A``: ``pg = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))``.
    Taking the max of the two *losses* is the pessimistic bound: the clip only
    bites when it would stop the update from pushing further in the direction
    ``A`` already favours (``r > 1 + clip_high`` for ``A > 0``, ``r < 1 - clip_low``
    for ``A < 0``); there the token's gradient is zero. ``clip_high > clip_low``
    gives DAPO's "clip-higher", leaving room to raise unlikely tokens.

    ``loss = pg_loss + kl_coef * kl_loss`` where ``kl_loss`` is the token-mean
    :func:`kl_k3` against ``ref_logprobs_B_T``. ``kl_loss`` is reported whenever
    a reference is given (0 otherwise) but only enters the graph if
    ``kl_coef > 0``. Behaviour log-probs, advantages and reference log-probs
    are treated as constants (detached).

    Metrics (token means over this call's mask, unaffected by ``normalizer``):
    ``pg_clipfrac`` is the fraction of tokens where the clipped term was
    selected, ``ratio_mean`` the mean (clamped) ratio, ``logprob_diff_mean``
    the mean ``|logp - logp_behaviour|``, a measure of how off-policy the batch
    is (including rollout-vs-learner numerical mismatch).
    """
    _check_same_shape(
        logprobs_B_T=logprobs_B_T, behaviour_logprobs_B_T=behaviour_logprobs_B_T, mask_B_T=mask_B_T
    )
    if ref_logprobs_B_T is not None:
        _check_same_shape(logprobs_B_T=logprobs_B_T, ref_logprobs_B_T=ref_logprobs_B_T)
    if logprobs_B_T.dim() != 2 or tuple(advantages_B.shape) != tuple(logprobs_B_T.shape[:1]):
        raise ValueError(
            f"expected logprobs [B, T] and advantages [B], got {tuple(logprobs_B_T.shape)} "
            f"and {tuple(advantages_B.shape)}"
        )
    if not 0.0 <= clip_low < 1.0:
        raise ValueError(f"clip_low must be in [0, 1), got {clip_low}")
    if not clip_high >= 0.0:
        raise ValueError(f"clip_high must be >= 0, got {clip_high}")
    if not kl_coef >= 0.0:
        raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
    if kl_coef > 0.0 and ref_logprobs_B_T is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs_B_T")

    keep_B_T = mask_B_T.bool()
    logprobs = _at_least_fp32(logprobs_B_T)
    behaviour = _at_least_fp32(behaviour_logprobs_B_T.detach())
    adv_B_1 = _at_least_fp32(advantages_B.detach()).unsqueeze(-1)

    def loss_mean(values_B_T: torch.Tensor) -> torch.Tensor:
        return masked_token_mean(values_B_T, keep_B_T, normalizer)

    def metric_mean(values_B_T: torch.Tensor) -> torch.Tensor:
        return masked_token_mean(values_B_T.detach(), keep_B_T)

    # Masked positions get log-ratio 0 (ratio 1) so padding never reaches exp.
    log_ratio_B_T = torch.where(keep_B_T, logprobs - behaviour, 0.0).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio_B_T = torch.exp(log_ratio_B_T)
    unclipped_B_T = -adv_B_1 * ratio_B_T
    clipped_B_T = -adv_B_1 * ratio_B_T.clamp(1.0 - clip_low, 1.0 + clip_high)
    pg_B_T = torch.maximum(unclipped_B_T, clipped_B_T)

    loss = loss_mean(pg_B_T)
    if ref_logprobs_B_T is not None:
        kl_B_T = kl_k3(logprobs, ref_logprobs_B_T.detach())
        if kl_coef > 0.0:
            loss = loss + kl_coef * loss_mean(kl_B_T)
        kl_loss = metric_mean(kl_B_T)
    else:
        kl_loss = loss.new_zeros(())

    with torch.no_grad():
        pg_loss = metric_mean(pg_B_T)
        clipfrac = metric_mean((clipped_B_T > unclipped_B_T).to(ratio_B_T.dtype))
        ratio_mean = metric_mean(ratio_B_T)
        logprob_diff_mean = metric_mean((logprobs - behaviour).abs())

    return LossOutput(
        loss=loss,
        pg_loss=pg_loss,
        kl_loss=kl_loss,
        pg_clipfrac=clipfrac,
        ratio_mean=ratio_mean,
        logprob_diff_mean=logprob_diff_mean,
    )
