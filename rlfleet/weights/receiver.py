"""Rollout side of a weight push: receive, verify, and hand back tensors.

Why receive() does not touch the model: the rollout engine must swap weights
atomically between generation steps, so it decides when; receive() only returns
verified tensors (views into the received buckets), and ``apply_to_module``
copies them in once every name and shape has been checked.

Why a version or checksum mismatch still drains every bucket: a broadcast is a
collective, so a receiver that stopped early would stall the learner and every
other worker. Draining keeps the group aligned for the next push.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rlfleet.errors import VersionMismatch, WeightSyncError
from rlfleet.weights.group import WeightGroup
from rlfleet.weights.naming import model_weights
from rlfleet.weights.manifest import Manifest, checksum, dtype_from_name

MAX_MANIFEST_BYTES = 256 * 1024 * 1024  # refuse to allocate for a garbage length


@dataclass
class ReceivedWeights:
    version: int
    tensors: dict[str, torch.Tensor]
    manifest: Manifest
    nbytes: int = 0
    buckets: list[torch.Tensor] = field(default_factory=list, repr=False)


class WeightReceiver:
    """Receives pushes from rank 0 on a non-zero rank of a WeightGroup."""

    def __init__(self, group: WeightGroup) -> None:
        if group.rank == 0:
            raise ValueError("WeightReceiver runs on ranks 1..N; rank 0 is the sender")
        self.group = group

    def receive(self, expected_version: int | None = None) -> ReceivedWeights:
        """Block for one push. Raises VersionMismatch, or WeightSyncError on timeout/corruption."""
        device = self.group.device
        length = torch.zeros(1, dtype=torch.int64, device=device)
        self.group.broadcast(length)
        n = int(length.item())
        if not 0 < n <= MAX_MANIFEST_BYTES:
            raise WeightSyncError(f"weight manifest length {n} is out of range")
        raw = torch.empty(n, dtype=torch.uint8, device=device)
        self.group.broadcast(raw)
        manifest = Manifest.from_bytes(raw.cpu().numpy().tobytes())
        buckets: list[torch.Tensor] = []
        works = []
        for spec in manifest.buckets:  # all receives issued at once; they complete in order
            buf = torch.empty(spec.nbytes, dtype=torch.uint8, device=device)
            if spec.nbytes:
                works.append(self.group.start_broadcast(buf))
            buckets.append(buf.view(dtype_from_name(spec.dtype)))
        for work in works:
            self.group.finish(work)
        if expected_version is not None and manifest.version != expected_version:
            raise VersionMismatch(f"expected weights version {expected_version}, learner sent {manifest.version}")
        bad = [i for i, (spec, buf) in enumerate(zip(manifest.buckets, buckets))
               if spec.checksum and checksum(buf) != spec.checksum]
        if bad:
            detail = ", ".join(f"bucket {i} ({manifest.buckets[i].dtype}, {manifest.buckets[i].nbytes} B)" for i in bad)
            raise WeightSyncError(f"weights version {manifest.version}: checksum mismatch in {detail}")
        tensors = {e.name: buckets[e.bucket][e.offset:e.offset + e.numel].view(e.shape) for e in manifest.entries}
        return ReceivedWeights(manifest.version, tensors, manifest, manifest.total_bytes, buckets)


def apply_to_module(module: torch.nn.Module, tensors: dict[str, torch.Tensor], strict: bool = True) -> list[str]:
    """Copy tensors into the module's parameters and buffers, casting dtype/device as needed.

    Everything is checked before anything is written, so a failure leaves the module
    untouched. With ``strict`` every parameter/buffer must be present and vice versa.
    Returns the names that were copied.
    """
    targets: dict[str, torch.Tensor] = dict(model_weights(module))
    if strict:
        missing = sorted(set(targets) - set(tensors))
        unexpected = sorted(set(tensors) - set(targets))
        if missing or unexpected:
            raise WeightSyncError(f"weight names do not match the module: missing {missing[:8]}"
                                  f"{'...' if len(missing) > 8 else ''}, unexpected {unexpected[:8]}"
                                  f"{'...' if len(unexpected) > 8 else ''}")
    names = [name for name in tensors if name in targets]
    for name in names:
        if tuple(targets[name].shape) != tuple(tensors[name].shape):
            raise WeightSyncError(f"shape mismatch for {name!r}: module has {tuple(targets[name].shape)}, "
                                  f"received {tuple(tensors[name].shape)}")
    with torch.no_grad():
        for name in names:
            targets[name].copy_(tensors[name])
    return names
