"""A short digest of a model's weights, to prove two copies are bit-for-bit equal.

Per tensor it folds in the name, dtype, shape and the exact integer checksum of
its bytes (computed on the tensor's own device), so comparing digests costs one
pass over the weights and no transfer.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable

import torch

from rlfleet.weights.manifest import checksum


def weights_digest(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    h = hashlib.sha256()
    for name, tensor in sorted(named_tensors, key=lambda item: item[0]):
        t = tensor.detach().contiguous()
        s1, s2 = checksum(t)
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|{s1}|{s2};".encode())
    return h.hexdigest()[:32]
