"""AdamW on float32 master copies of 16-bit weights: mixed-precision training's optimizer.

A bfloat16 weight keeps 8 significant bits: one in [2^-7, 2^-6) lies 2^-14 = 6.1e-5 from its
neighbours, so an AdamW step of lr = 2e-5 (about lr per weight early on) rounds back to the same value
for every weight of magnitude above ~lr * 2^9 = 0.01. Stepped in bfloat16, a small-lr run trains only
its smallest weights (issue 45: 3.9 % of SmolLM2-135M's weights change at 2e-5, 0.17 % at 1.8e-6).

Here the model keeps computing in its own dtype; the optimizer holds a float32 copy of each trainable
parameter (so its moments are float32 too), steps the copies with the gradients cast up, and writes them
back rounded. Updates below the weights' resolution then add up in the copies and reach the model once
they amount to a step of its dtype: what verl's FSDP mixed precision and TRL's bf16 AMP keep as well.
The copies are part of the state dict, so a resumed run continues from them exactly.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

MASTER_KEY = "master_weights"


class MasterWeightAdamW(torch.optim.AdamW):
    """torch.optim.AdamW over float32 copies of `params` (one group); the model's parameters keep
    their dtype and receive the copies after every step."""

    def __init__(self, params: Iterable[torch.nn.Parameter], **adamw: Any):
        self.model_params = list(params)
        masters = [p.detach().to(torch.float32).clone() for p in self.model_params]
        super().__init__(masters, **adamw)

    def masters(self) -> list[torch.Tensor]:
        return self.param_groups[0]["params"]

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001 - torch's signature
        if closure is not None:
            raise ValueError("MasterWeightAdamW.step takes no closure")
        for p, m in zip(self.model_params, self.masters()):
            m.grad = None if p.grad is None else p.grad.to(torch.float32)
            p.grad = None  # its float32 copy is what the step reads
        super().step()
        for p, m in zip(self.model_params, self.masters()):
            p.copy_(m)
            m.grad = None
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.model_params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()
        super().zero_grad(set_to_none)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state[MASTER_KEY] = [m.detach().clone() for m in self.masters()]
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores the moments and the float32 copies; a state without copies (a checkpoint written by
        a plain AdamW) takes them from the model's parameters, which the caller loaded first."""
        state = dict(state_dict)
        saved = state.pop(MASTER_KEY, None)
        if saved is not None and len(saved) != len(self.model_params):
            raise ValueError(f"{len(saved)} master weights saved, {len(self.model_params)} parameters here")
        super().load_state_dict(state)
        with torch.no_grad():
            for i, (p, m) in enumerate(zip(self.model_params, self.masters())):
                source = p if saved is None else saved[i]
                if source.shape != m.shape:
                    raise ValueError(f"master weight {i}: shape {tuple(source.shape)}, parameter "
                                     f"{tuple(m.shape)}")
                m.copy_(source.detach().to(m.device, torch.float32))


def low_precision(params: list[torch.nn.Parameter]) -> bool:
    return any(p.dtype in (torch.bfloat16, torch.float16) for p in params)


def build_adamw(params: Iterable[torch.nn.Parameter], *, master_weights: bool,
                **adamw: Any) -> torch.optim.AdamW:
    """AdamW for the policy: over float32 master copies when asked and its weights are 16-bit, else plain."""
    params = list(params)
    if master_weights and low_precision(params):
        return MasterWeightAdamW(params, **adamw)
    return torch.optim.AdamW(params, **adamw)
