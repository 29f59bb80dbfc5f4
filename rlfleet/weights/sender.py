"""Learner side of a weight push: manifest first, then each flat bucket.

Why two passes over the parameters: the manifest (which carries every bucket's
checksum) must go out before the first bucket, but holding every packed bucket
at once would cost a full extra copy of the model on the learner's device. So
pass 1 packs each bucket, checksums it and frees it; pass 2 packs it again and
broadcasts it. Packing is a device-local copy, cheap next to the network.
"""
from __future__ import annotations

import time
from collections.abc import Iterable

import torch

from rlfleet.weights.group import WeightGroup
from rlfleet.weights.manifest import (DEFAULT_BUCKET_BYTES, BucketSpec, Manifest, checksum, dtype_from_name,
                                      plan_buckets)


class WeightSender:
    """Pushes named tensors from rank 0 to every other rank of a WeightGroup."""

    def __init__(self, group: WeightGroup, bucket_bytes: int = DEFAULT_BUCKET_BYTES, checksums: bool = True) -> None:
        if group.rank != 0:
            raise ValueError(f"WeightSender must run on rank 0, this group is rank {group.rank}")
        if bucket_bytes <= 0:
            raise ValueError("bucket_bytes must be positive")
        self.group = group
        self.bucket_bytes = bucket_bytes
        # Checksums cost a second packing pass and a pass over every bucket on each side; they
        # guard transports without integrity of their own (see rlfleet.devices.weight_checksums).
        self.checksums = checksums
        self.packed = 0  # tensors packed by the current push (a sharded learner's ranks resume from here)

    def push(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> dict:
        """Send one consistent snapshot; returns stats (bytes, buckets, tensors, seconds).

        The caller must not modify the tensors until push() returns. Raises
        WeightSyncError (from the group) on timeout or transport failure.
        """
        start = time.perf_counter()
        self.packed = 0
        named = [(name, t.detach()) for name, t in named_tensors]
        manifest = plan_buckets(named, version, self.bucket_bytes)
        tensors = dict(named)
        by_bucket: list[list[int]] = [[] for _ in manifest.buckets]
        for i, entry in enumerate(manifest.entries):
            by_bucket[entry.bucket].append(i)
        for b, spec in enumerate(manifest.buckets):
            if not self.checksums:
                manifest.buckets[b] = BucketSpec(spec.dtype, spec.numel, ())
                continue
            flat = self._pack(manifest, b, by_bucket[b], tensors)
            manifest.buckets[b] = BucketSpec(spec.dtype, spec.numel, checksum(flat))
            del flat
        packed_s = time.perf_counter() - start
        payload = manifest.to_bytes()
        device = self.group.device
        self.group.broadcast(torch.tensor([len(payload)], dtype=torch.int64, device=device))
        self.group.broadcast(torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device))
        # Double buffering: bucket b+1 is packed while bucket b is on the wire.
        in_flight: list[tuple[torch.distributed.Work, torch.Tensor]] = []
        for b, spec in enumerate(manifest.buckets):
            if spec.numel == 0:
                continue  # both sides skip empty buckets; collectives of 0 bytes are backend-dependent
            flat = self._pack(manifest, b, by_bucket[b], tensors)
            in_flight.append((self.group.start_broadcast(flat.view(torch.uint8)), flat))
            if len(in_flight) > 1:
                self.group.finish(in_flight.pop(0)[0])
        for work, _ in in_flight:
            self.group.finish(work)
        return {
            "version": version,
            "bytes": manifest.total_bytes,
            "manifest_bytes": len(payload),
            "buckets": len(manifest.buckets),
            "tensors": len(manifest.entries),
            "pack_seconds": packed_s,
            "seconds": time.perf_counter() - start,
        }

    def _pack(self, manifest: Manifest, bucket: int, entry_ids: list[int],
              tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        """Contiguous copy of the bucket's tensors into one flat buffer on the group's device."""
        spec = manifest.buckets[bucket]
        flat = torch.empty(spec.numel, dtype=dtype_from_name(spec.dtype), device=self.group.device)
        with torch.no_grad():
            for i in entry_ids:
                e = manifest.entries[i]
                flat[e.offset:e.offset + e.numel].view(e.shape).copy_(_whole(tensors[e.name]))
                self.packed += 1
        return flat


def _whole(t: torch.Tensor) -> torch.Tensor:
    """A sharded learner's parameter (an FSDP2 DTensor) is gathered here, while its bucket is packed:
    every learner rank must take part, in this order (services.learner.fsdp.ShardedLearner.follow_push)."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t
