"""Which tensors of a model are its weights: what a checkpoint holds, each shared tensor once.

That is the parameters and persistent buffers (`state_dict`), without buffers that a model
recomputes itself (rotary `inv_freq`), which vLLM's loaders do not accept, and with tied
tensors (embeddings shared with the LM head) sent once, under their first name.
"""
from __future__ import annotations

import torch


def model_weights(module: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    seen: set[int] = set()
    weights = []
    for name, tensor in module.state_dict(keep_vars=True).items():
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        weights.append((name, tensor))
    return weights
