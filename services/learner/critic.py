"""The value model PPO's GAE needs: a separate critic trained by the learner, as in verl.

The critic is the policy's base model with a scalar head (``AutoModelForTokenClassification``
with one label, initialised from the policy's weights; the head starts near 0). Its value at
position ``t`` is ``V(s_t)``, the state after the tokens up to ``t``; that is the same
alignment as the log-prob of the token at ``t + 1``, so the response mask applies unchanged.

The value loss is PPO's clipped one (verl's ``compute_value_loss``):
``0.5 * max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2)``, aggregated like the policy
loss. It has its own optimizer, so no value-loss coefficient is needed.
"""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForTokenClassification

from services.learner.algorithms.aggregation import weighted_sum
from services.learner.batching import MicroBatch
from services.learner.loss import masked_token_mean


def clipped_value_loss(values_B_T: torch.Tensor, old_values_B_T: torch.Tensor, returns_B_T: torch.Tensor,
                       mask_B_T: torch.Tensor, weights_B_T: torch.Tensor,
                       value_clip: float | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (loss, token-mean unweighted loss, clip fraction); the latter two detached."""
    values = values_B_T.float()
    old = old_values_B_T.detach().float()
    returns = returns_B_T.detach().float()
    unclipped_B_T = (values - returns).square()
    if value_clip is None:
        loss_B_T, clipped_B_T = 0.5 * unclipped_B_T, torch.zeros_like(mask_B_T, dtype=torch.bool)
    else:
        clipped_values = old + (values - old).clamp(-value_clip, value_clip)
        clipped_sq_B_T = (clipped_values - returns).square()
        loss_B_T = 0.5 * torch.maximum(unclipped_B_T, clipped_sq_B_T)
        clipped_B_T = clipped_sq_B_T > unclipped_B_T
    loss = weighted_sum(loss_B_T, mask_B_T, weights_B_T)
    return (loss, masked_token_mean(loss_B_T.detach(), mask_B_T),
            masked_token_mean(clipped_B_T.float(), mask_B_T))


class Critic:
    def __init__(self, model_path: Path, device: torch.device, dtype: torch.dtype, lr: float,
                 betas: tuple[float, float], weight_decay: float, grad_clip: float, value_clip: float | None):
        # No dropout before the value head: it would make the value targets noisy for nothing.
        config = AutoConfig.from_pretrained(model_path, num_labels=1, classifier_dropout=0.0)
        self.model = AutoModelForTokenClassification.from_pretrained(model_path, config=config,
                                                                     dtype=dtype).to(device)
        self.model.train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, betas=betas,
                                           weight_decay=weight_decay, fused=device.type == "cuda")
        self.grad_clip = grad_clip
        self.value_clip = value_clip

    def _values(self, mb: MicroBatch) -> torch.Tensor:
        logits = self.model(input_ids=mb.input_ids_B_L, attention_mask=mb.attention_mask_B_L).logits
        return logits[:, :-1, 0].float()

    @torch.no_grad()
    def values(self, mb: MicroBatch) -> torch.Tensor:
        return self._values(mb)

    def update(self, micro_batches: list[tuple[MicroBatch, torch.Tensor, torch.Tensor, torch.Tensor]],
               total_tokens: int) -> dict[str, float]:
        """One optimizer step over a mini-batch of (micro-batch, old values, returns, weights)."""
        self.optimizer.zero_grad(set_to_none=True)
        sums = {"critic/vf_loss": 0.0, "critic/vf_clipfrac": 0.0, "critic/vpred_mean": 0.0}
        for mb, old_values_B_T, returns_B_T, weights_B_T in micro_batches:
            values_B_T = self._values(mb)
            loss, vf_loss, clipfrac = clipped_value_loss(values_B_T, old_values_B_T, returns_B_T,
                                                         mb.response_mask_B_T, weights_B_T, self.value_clip)
            loss.backward()
            share = mb.num_tokens / max(total_tokens, 1)
            sums["critic/vf_loss"] += float(vf_loss) * share
            sums["critic/vf_clipfrac"] += float(clipfrac) * share
            sums["critic/vpred_mean"] += float(masked_token_mean(values_B_T.detach(),
                                                                 mb.response_mask_B_T)) * share
        max_norm = self.grad_clip if self.grad_clip > 0 else float("inf")
        sums["critic/grad_norm"] = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        self.optimizer.step()
        return sums
