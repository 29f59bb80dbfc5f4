"""The frozen reference policy a KL term is measured against.

Without LoRA it is a frozen copy of the initial policy. With LoRA it is the policy itself
with its adapters switched off (the base weights never change), which costs no memory.
"""
from __future__ import annotations

import copy

import torch

from services.learner.batching import MicroBatch
from services.learner.loss import token_logprobs


def model_logprobs(model: torch.nn.Module, mb: MicroBatch, temperature: float) -> torch.Tensor:
    logits = model(input_ids=mb.input_ids_B_L, attention_mask=mb.attention_mask_B_L).logits
    return token_logprobs(logits[:, :-1], mb.targets_B_T, temperature)


class FrozenCopyReference:
    def __init__(self, policy: torch.nn.Module) -> None:
        self.model = copy.deepcopy(policy).eval().requires_grad_(False)

    @torch.no_grad()
    def logprobs(self, mb: MicroBatch, temperature: float) -> torch.Tensor:
        return model_logprobs(self.model, mb, temperature)


class AdapterDisabledReference:
    def __init__(self, peft_policy: torch.nn.Module) -> None:
        self.model = peft_policy

    @torch.no_grad()
    def logprobs(self, mb: MicroBatch, temperature: float) -> torch.Tensor:
        with self.model.disable_adapter():
            return model_logprobs(self.model, mb, temperature)
