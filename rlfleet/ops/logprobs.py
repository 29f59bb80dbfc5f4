"""Token log-probs and entropy of tempered logits: the math the learner's losses and the rollout engines'
behaviour log-probs must agree on, so both roles import it from the core.

Pure torch, no I/O. Shapes are spelled in names: ``B`` sequences, ``T`` tokens, ``V`` vocabulary
entries. Everything is computed in at least float32, whatever the model's dtype, because log-ratios
of nearly equal bf16 log-probs are mostly rounding noise.
"""
from __future__ import annotations

import torch

__all__ = ["check_temperature", "token_entropy", "token_logprobs"]


def check_temperature(temperature: float) -> None:
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
    check_temperature(temperature)
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
    check_temperature(temperature)
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
