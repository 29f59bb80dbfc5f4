"""Fused Triton kernels for the learner's model, from Liger Kernel (`learner.fused_kernels`).

A small model trained on short rows spends most of its step in memory-bound elementwise
kernels: RMSNorm alone is ~8 unfused kernels per call in transformers' Llama, forward and
backward, plus the rotary embedding and the SwiGLU product. Liger replaces each by one fused
kernel, forward and backward, on the model instance (the same kernels TRL's `use_liger_kernel`
and verl's `use_liger` turn on). Only RMSNorm, rotary and SwiGLU are swapped: the learner
computes token log-probs itself (services/learner/forward.py), so Liger's fused losses are not used.
"""
from __future__ import annotations

import importlib.util

import structlog
import torch

from rlfleet.errors import ConfigError

log = structlog.get_logger(__name__)

#: model types whose RMSNorm/rotary/SwiGLU Liger swaps and the learner has been checked with
LIGER_MODEL_TYPES = frozenset({"llama", "qwen2", "qwen3", "mistral"})


def liger_unavailable_reason(model: torch.nn.Module, device: torch.device) -> str | None:
    """Why Liger's kernels cannot run for this model here, or None if they can."""
    if device.type != "cuda":
        return "Liger's kernels are Triton kernels: they run on CUDA only"
    model_type = getattr(model.config, "model_type", None)
    if model_type not in LIGER_MODEL_TYPES:
        return f"model type {model_type!r} is not one of {sorted(LIGER_MODEL_TYPES)}"
    if importlib.util.find_spec("liger_kernel") is None:
        return "the liger-kernel package is not installed (pip install 'rlfleet[gpu]' or liger-kernel)"
    return None


def apply_fused_kernels(model: torch.nn.Module, setting: str, device: torch.device) -> str:
    """Applies `learner.fused_kernels` (auto, liger, none) to `model` in place; returns what was applied
    ("liger" or "none"). `liger` insists (a clear error naming the key if it cannot run), `auto` uses
    Liger where it can and says why not otherwise."""
    if setting == "none":
        return "none"
    reason = liger_unavailable_reason(model, device)
    if reason is not None:
        if setting == "liger":
            raise ConfigError(f"learner.fused_kernels=liger: {reason}; "
                              "set learner.fused_kernels=auto or none")
        log.info("learner.fused_kernels_unavailable", reason=reason, using="transformers' own modules")
        return "none"
    from liger_kernel.transformers import _apply_liger_kernel_to_instance

    _apply_liger_kernel_to_instance(model=model, rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
                                    fused_linear_cross_entropy=False)
    log.info("learner.fused_kernels", kernels="liger", parts="rms_norm,rope,swiglu")
    return "liger"
