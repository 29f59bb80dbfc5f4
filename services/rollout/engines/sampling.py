"""Next-token choice from float32 logits, as transformers' generate() makes it.

Same order of processing (eos forbidden on the first token, temperature, top-k, top-p) and
the same logprob convention as the rest of the rollout: log-softmax of the temperature-scaled
logits before any filtering. Sampling uses the exponential race (argmax of p / E, E ~ Exp(1)),
which draws from p without the host synchronisation torch.multinomial makes (computed as
argmax(logits - log E), with no softmax).
"""
from __future__ import annotations

import torch

from rlfleet.types import SamplingParams


def _choose(scaled: torch.Tensor, noise: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens (greedy without `noise`, else the exponential race) and their log-softmax values."""
    tokens = scaled.argmax(dim=-1) if noise is None else (scaled - noise.log()).argmax(dim=-1)
    return tokens, scaled.gather(1, tokens[:, None])[:, 0] - torch.logsumexp(scaled, dim=-1)


def scaled_choose(logits: torch.Tensor, noise: torch.Tensor | None,
                   inverse_temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _choose(logits * inverse_temperature if inverse_temperature != 1.0 else logits, noise)


class TokenSampler:
    """With `fused` (a GPU), the common step (no top-k/top-p, not the first token) is one compiled
    region: temperature, the race's argmax and the log-normaliser in a pass or two over the
    [B, V] logits, where the eager ops made eight (a sixth of a SmolLM2-135M decode step)."""

    def __init__(self, params: SamplingParams, eos_ids: list[int], device: torch.device, fused=None):
        self.params = params
        self.fused = fused
        self.greedy = params.temperature == 0
        self.temperature = 1.0 if self.greedy else params.temperature
        self.eos = torch.tensor(eos_ids, dtype=torch.long, device=device)
        self.generator = None
        if params.seed is not None and not self.greedy:
            self.generator = torch.Generator(device=device)
            self.generator.manual_seed(params.seed)

    def __call__(self, logits: torch.Tensor, first: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens [B] and their logprobs [B] for logits [B, V]."""
        plain = not first and not self.params.top_k and self.params.top_p >= 1.0
        if self.fused is not None and plain:
            noise = None if self.greedy else torch.empty_like(logits).exponential_(generator=self.generator)
            return self.fused(logits, noise, 1.0 / self.temperature)
        scaled = logits / self.temperature if self.temperature != 1.0 else logits
        choice = scaled.clone() if first else scaled
        if first:  # min_new_tokens=1: a completion has at least one token before eos
            choice[:, self.eos] = float("-inf")
        if self.greedy:
            tokens = choice.argmax(dim=-1)
        else:
            choice = self._filter(choice)
            noise = torch.empty_like(choice).exponential_(generator=self.generator)
            # argmax(p / E) = argmax(log p - log E), and log p differs from the logits by a constant
            # per row: no softmax pass over the vocabulary is needed.
            tokens = (choice - noise.log_()).argmax(dim=-1)
        # log-softmax at the chosen token only: the [B, V] log-softmax is never written out
        return tokens, scaled.gather(1, tokens[:, None])[:, 0] - torch.logsumexp(scaled, dim=-1)

    def _filter(self, logits: torch.Tensor) -> torch.Tensor:
        top_k, top_p = self.params.top_k, self.params.top_p
        if top_k and top_k < logits.shape[-1]:
            kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if top_p < 1.0:
            ascending, order = torch.sort(logits, dim=-1)
            drop = torch.softmax(ascending, dim=-1).cumsum(dim=-1) <= 1 - top_p
            drop[:, -1] = False  # the most likely token always stays
            logits = logits.scatter(1, order, ascending.masked_fill(drop, float("-inf")))
        return logits
