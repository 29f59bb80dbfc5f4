"""Named weights of a made-up model for the GPU weight-transfer tests: two dtypes, a
non-contiguous view, a 0-d tensor; `layers` changes the layout, `version` the values."""
from __future__ import annotations

import torch


def push_weights(version: int, layers: int, device: torch.device) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator(device=device).manual_seed(version)
    out = [("embed", torch.randn(1000, 64, generator=g, device=device).bfloat16())]
    for i in range(layers):
        out += [(f"l{i}.w", torch.randn(64, 64, generator=g, device=device).bfloat16()),
                (f"l{i}.b", torch.randn(64, generator=g, device=device)),  # a second dtype
                (f"l{i}.wt", torch.randn(32, 64, generator=g,
                                         device=device).bfloat16().t())]  # non-contiguous
    return out + [("step", torch.tensor(version, device=device))]
