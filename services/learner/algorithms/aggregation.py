"""Loss aggregation: how per-token losses of a mini-batch become the one number to minimise.

Every mode is a per-token *weight* ``w_bt``; the loss is ``sum_bt w_bt * loss_bt`` over
unmasked tokens. Weights divide by counts of the whole mini-batch (one optimizer step),
never of a micro-batch, so the micro-batch losses of a split mini-batch (and their
gradients) sum exactly to the unsplit values. With ``N`` tokens, ``S`` sequences,
``n_b`` tokens in sequence ``b`` and a constant ``L`` (``loss_scale_tokens``):

==========================  ===================  ========================================
mode                        ``w_bt``             who uses it
==========================  ===================  ========================================
token-mean                  ``1 / N``            DAPO, verl's default: every token equal
seq-mean-token-sum          ``1 / S``            long responses weigh more
seq-mean-token-mean         ``1 / (S n_b)``      the original GRPO, GSPO: sequences equal
seq-mean-token-sum-norm     ``1 / (S L)``        Dr. GRPO: unbiased, length-independent
==========================  ===================  ========================================

Fully masked rows are not sequences: they neither count in ``S`` nor receive weight.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch



@dataclass(frozen=True)
class BatchCounts:
    """Counts of the whole mini-batch that weights divide by."""

    num_tokens: int
    num_sequences: int
    loss_scale_tokens: int = 1

    @classmethod
    def of(cls, masks_B_T: list[torch.Tensor], loss_scale_tokens: int = 1) -> BatchCounts:
        """Counts over the masks of every micro-batch of one mini-batch."""
        return cls(num_tokens=int(sum(int(m.bool().sum()) for m in masks_B_T)),
                   num_sequences=int(sum(int(m.bool().any(dim=-1).sum()) for m in masks_B_T)),
                   loss_scale_tokens=loss_scale_tokens)


LossWeights = Callable[[torch.Tensor, BatchCounts], torch.Tensor]


def _keep(mask_B_T: torch.Tensor) -> torch.Tensor:
    return mask_B_T.bool().to(torch.float32)


def token_mean_weights(mask_B_T: torch.Tensor, counts: BatchCounts) -> torch.Tensor:
    return _keep(mask_B_T) / max(counts.num_tokens, 1)


def seq_mean_token_sum_weights(mask_B_T: torch.Tensor, counts: BatchCounts) -> torch.Tensor:
    return _keep(mask_B_T) / max(counts.num_sequences, 1)


def seq_mean_token_mean_weights(mask_B_T: torch.Tensor, counts: BatchCounts) -> torch.Tensor:
    keep_B_T = _keep(mask_B_T)
    tokens_B_1 = keep_B_T.sum(dim=-1, keepdim=True).clamp(min=1.0)
    return keep_B_T / tokens_B_1 / max(counts.num_sequences, 1)


def seq_mean_token_sum_norm_weights(mask_B_T: torch.Tensor, counts: BatchCounts) -> torch.Tensor:
    return _keep(mask_B_T) / (max(counts.num_sequences, 1) * counts.loss_scale_tokens)


def weighted_sum(values_B_T: torch.Tensor, mask_B_T: torch.Tensor, weights_B_T: torch.Tensor) -> torch.Tensor:
    """``sum w * v`` over unmasked tokens; masked values (even NaN or inf) never reach the sum."""
    values = values_B_T.float() if values_B_T.dtype in (torch.float16, torch.bfloat16) else values_B_T
    return (torch.where(mask_B_T.bool(), values, 0.0) * weights_B_T).sum()
