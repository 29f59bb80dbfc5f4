"""LoRA training of the policy through peft, and the merged weights a rollout needs.

The rollout serves the plain model, so a weight push sends, under the plain model's
parameter names, ``W + scale * B @ A`` for every adapted layer and the untouched tensors
for the rest. Merged copies are computed per push; the adapters are never merged into the
trained weights in place, which would make the base weights drift by rounding each time.
"""
from __future__ import annotations

import torch

from rlfleet.weights.naming import model_weights

from rlfleet.algorithm import LoraConfig

_BASE_LAYER = ".base_layer"


def apply_lora(model: torch.nn.Module, cfg: LoraConfig) -> torch.nn.Module:
    """The model wrapped with fresh adapters (only they train), or the model itself for rank 0."""
    if cfg.rank == 0:
        return model
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    return get_peft_model(model, PeftLoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                                                target_modules=cfg.target_modules, bias="none"))


def is_lora(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config")


def _adapted_layers(base: torch.nn.Module) -> dict[str, torch.nn.Module]:
    from peft.tuners.lora import LoraLayer

    return {name: module for name, module in base.named_modules() if isinstance(module, LoraLayer)}


@torch.no_grad()
def policy_weights(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The weights (rlfleet.weights.naming) under the plain model's names, LoRA deltas merged in."""
    if not is_lora(model):
        return model_weights(model)
    base = model.get_base_model()
    layers = _adapted_layers(base)
    out = []
    for name, tensor in model_weights(base):
        if ".lora_" in name:
            continue
        owner, _, leaf = name.rpartition(".")
        if owner.endswith(_BASE_LAYER):
            layer_name = owner.removesuffix(_BASE_LAYER)
            layer = layers[layer_name]
            if leaf == "weight":
                for adapter in layer.active_adapters:
                    tensor = tensor + layer.get_delta_weight(adapter).to(tensor.dtype)
            name = f"{layer_name}.{leaf}"
        out.append((name, tensor.detach()))
    return out
