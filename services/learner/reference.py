"""The frozen reference policy a KL term is measured against.

Without LoRA it is a frozen copy of the initial policy. With LoRA it is the policy itself
with its adapters switched off (the base weights never change), which costs no memory.
"""
from __future__ import annotations

import copy

import torch

from services.learner.batching import MicroBatch
from services.learner.forward import PLAIN, ForwardSettings, policy_logprobs


def model_logprobs(model: torch.nn.Module, mb: MicroBatch, temperature: float,
                   forward: ForwardSettings = PLAIN) -> torch.Tensor:
    return policy_logprobs(model, mb, temperature, forward, with_entropy=False)[0]


class FrozenCopyReference:
    def __init__(self, policy: torch.nn.Module) -> None:
        self.model = copy.deepcopy(policy).eval().requires_grad_(False)

    @torch.no_grad()
    def logprobs(self, mb: MicroBatch, temperature: float, forward: ForwardSettings = PLAIN) -> torch.Tensor:
        return model_logprobs(self.model, mb, temperature, forward)


class AdapterDisabledReference:
    def __init__(self, peft_policy: torch.nn.Module) -> None:
        self.model = peft_policy

    @torch.no_grad()
    def logprobs(self, mb: MicroBatch, temperature: float, forward: ForwardSettings = PLAIN) -> torch.Tensor:
        with self.model.disable_adapter():
            return model_logprobs(self.model, mb, temperature, forward)
