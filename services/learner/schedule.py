"""The learning-rate schedule: linear warmup, then constant, linear or cosine decay.

Stepped once per Train call (one policy version), as verl steps its scheduler once
per training step; `total_steps` is the job's `controller.max_steps`. The names are
those TRL users know from `lr_scheduler_type`, the warmup those verl users know from
`lr_warmup_steps` / `lr_warmup_steps_ratio`, and `min_lr_ratio` is the floor the
decay ends at, as a fraction of `learner.lr`.
"""
from __future__ import annotations

import math

import torch


def warmup_steps(total_steps: int, steps: int, ratio: float) -> int:
    """Explicit steps win; else the ratio of the job's steps, rounded up (0.03 of 100 steps is 3)."""
    return steps if steps > 0 else math.ceil(ratio * total_steps)


def lr_factor(step: int, *, kind: str, total_steps: int, warmup: int, min_lr_ratio: float) -> float:
    """Multiplier of the base learning rate for the optimizer step numbered `step` (0-based)."""
    if step < warmup:
        return (step + 1) / (warmup + 1)  # never 0: the first step already moves the policy a little
    if kind == "constant":
        return 1.0
    decay_steps = max(1, total_steps - warmup)
    progress = min(1.0, (step - warmup) / decay_steps)
    if kind == "linear":
        shape = 1.0 - progress
    elif kind == "cosine":
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        raise ValueError(f"learner.lr_scheduler: unknown schedule {kind!r}")
    return min_lr_ratio + (1.0 - min_lr_ratio) * shape


def build_lr_scheduler(optimizer: torch.optim.Optimizer, *, kind: str, total_steps: int, warmup_steps_: int,
                       min_lr_ratio: float) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, kind=kind, total_steps=total_steps, warmup=warmup_steps_,
                                          min_lr_ratio=min_lr_ratio))
