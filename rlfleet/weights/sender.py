"""Learner side of a weight push: a small header, the layout when it changed, then each flat bucket.

Why the plan is cached: names, shapes and dtypes are the same on every push of a run, so
the bucket plan, its JSON and its digest are computed once and reused while the tensors'
(name, shape, dtype) list is unchanged; the layout goes on the wire only when the group
has not seen it yet (see rlfleet.weights.manifest).

Why one grouped copy per bucket: packing with one ``copy_`` per tensor costs a kernel
launch and several Python calls each (a 0.5B model has 290 tensors); one ``torch.cat``
into the bucket (or ``_foreach_copy_`` into views of it, when tensors live on another
device or are sharded) is one grouped launch for the whole bucket.

Why two passes over the parameters when checksums are on: the checksums must go out
before the first bucket, but holding every packed bucket at once would cost a full extra
copy of the model on the learner's device. So pass 1 packs each bucket, checksums it and
frees it; pass 2 packs it again and broadcasts it. Without checksums (NCCL) there is one pass.
"""
from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from rlfleet.weights.group import WeightGroup
from rlfleet.weights.manifest import (DEFAULT_BUCKET_BYTES, FLAG_CHECKSUMS, Manifest, checksum,
                                      dtype_from_name,
                                      encode_header, layout_digest, plan_buckets)


@dataclass
class _Plan:
    """One layout, as reused from push to push while the tensors' names, shapes and dtypes hold."""

    key: tuple
    layout: Manifest  # version 0, no checksums
    data: bytes  # layout.to_bytes(), sent when the group has not seen this digest
    digest: tuple[int, ...]
    by_bucket: list[list[tuple[int, int]]]  # per bucket, in manifest order: (entry index, index in `named`)


class WeightSender:
    """Pushes named tensors from rank 0 to every other rank of a WeightGroup."""

    def __init__(self, group: WeightGroup, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 checksums: bool = True) -> None:
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
        self._plan: _Plan | None = None

    def push(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> dict:
        """Send one consistent snapshot; returns stats (bytes, buckets, tensors, seconds).

        The caller must not modify the tensors until push() returns. Raises
        WeightSyncError (from the group) on timeout or transport failure.
        """
        start = time.perf_counter()
        self.packed = 0
        named = named_tensors if isinstance(named_tensors, list) else list(named_tensors)
        plan = self._plan_for(named)
        srcs = [t for _, t in named]
        layout, group, device = plan.layout, self.group, self.group.device
        sums: list[tuple[int, int]] | None = None
        if self.checksums:
            sums = []
            for b in range(len(layout.buckets)):
                flat = self._pack(plan, b, srcs)
                sums.append(checksum(flat))
                del flat
        packed_s = time.perf_counter() - start
        # The group forgets the layout whenever its process group is rebuilt (on every rank alike).
        send_layout = group.cache.get("sent_layout") != plan.digest
        header = encode_header(version, len(layout.buckets), len(plan.data) if send_layout else 0,
                               FLAG_CHECKSUMS if sums is not None else 0, plan.digest)
        # The small tensors are waited for before any bucket goes out: a receiver that leaves
        # after the header then fails this push with nothing else in flight (gloo work left
        # pending on a dead peer can abort the process at exit).
        small: list[torch.Tensor] = [torch.tensor(header, dtype=torch.int64, device=device)]
        if send_layout:
            small.append(torch.frombuffer(bytearray(plan.data), dtype=torch.uint8).to(device))
        if sums is not None:
            small.append(torch.tensor([w for pair in sums for w in pair], dtype=torch.int64, device=device))
        for t in small:
            group.finish(group.start_broadcast(t))
        # Double buffering: only a bucket's predecessor is waited for.
        in_flight: list[tuple[torch.distributed.Work, torch.Tensor]] = []
        for b, spec in enumerate(layout.buckets):
            if spec.numel == 0:
                continue  # both sides skip empty buckets; collectives of 0 bytes are backend-dependent
            flat = self._pack(plan, b, srcs)  # bucket b is packed while bucket b-1 is on the wire
            in_flight.append((group.start_broadcast(flat.view(torch.uint8)), flat))
            while len(in_flight) > 1:
                group.finish(in_flight.pop(0)[0])
        for work, _ in in_flight:
            group.finish(work)
        group.cache["sent_layout"] = plan.digest  # only once every rank has received it
        return {
            "version": version,
            "bytes": layout.total_bytes,
            "manifest_bytes": len(plan.data) if send_layout else 0,
            "buckets": len(layout.buckets),
            "tensors": len(layout.entries),
            "pack_seconds": packed_s,
            "seconds": time.perf_counter() - start,
        }

    def _plan_for(self, named: list[tuple[str, torch.Tensor]]) -> _Plan:
        """The cached plan when the (name, shape, dtype) list is unchanged, else a new one."""
        key = (self.bucket_bytes, tuple((name, t.shape, t.dtype) for name, t in named))
        if self._plan is not None and self._plan.key == key:
            return self._plan
        manifest = plan_buckets(named, 0, self.bucket_bytes)
        index = {name: i for i, (name, _) in enumerate(named)}
        by_bucket: list[list[tuple[int, int]]] = [[] for _ in manifest.buckets]
        for i, entry in enumerate(manifest.entries):
            by_bucket[entry.bucket].append((i, index[entry.name]))
        layout = manifest.layout()
        data = layout.to_bytes()
        self._plan = _Plan(key, layout, data, layout_digest(data), by_bucket)
        return self._plan

    def _pack(self, plan: _Plan, bucket: int, srcs: list[torch.Tensor],
              out: torch.Tensor | None = None) -> torch.Tensor:
        """Contiguous copy of the bucket's tensors into one flat buffer (`out`, else a new one on the
        group's device)."""
        spec = plan.layout.buckets[bucket]
        flat = out if out is not None else torch.empty(spec.numel, dtype=dtype_from_name(spec.dtype),
                                                       device=self.group.device)
        pairs = plan.by_bucket[bucket]
        pieces = [srcs[j] for _, j in pairs]
        dtensor = _dtensor_type()
        with torch.no_grad():
            if all(not isinstance(t, dtensor) and t.device == flat.device for t in pieces):
                # The common case: the entries tile the bucket in order (plan_buckets packs them
                # back to back), so one cat writes it; reshape(-1) is a view of a contiguous tensor.
                torch.cat([t.reshape(-1) for t in pieces], out=flat)
                self.packed += len(pieces)
                return flat
            entries, dsts, plain = plan.layout.entries, [], []
            for (i, _), src in zip(pairs, pieces):
                e = entries[i]
                dst = flat[e.offset:e.offset + e.numel].view(e.shape)
                if isinstance(src, dtensor):
                    # Gathered and copied at once, in manifest order (the sharded learner's other
                    # ranks gather in the same order), so at most one gathered tensor is alive.
                    dst.copy_(src.full_tensor())
                else:
                    dsts.append(dst)
                    plain.append(src)
                self.packed += 1
            if dsts:  # one grouped copy; it also moves tensors from another device (a gloo bucket on the CPU)
                torch._foreach_copy_(dsts, plain)
        return flat


_DTENSOR: type | None = None


def _dtensor_type() -> type:
    """A sharded learner's parameter (an FSDP2 DTensor) is gathered while its bucket is packed:
    every learner rank must take part, in this order (services.learner.fsdp.ShardedLearner.follow_push).
    Imported on first use: torch.distributed.tensor is slow to import and rollouts never need it."""
    global _DTENSOR
    if _DTENSOR is None:
        from torch.distributed.tensor import DTensor

        _DTENSOR = DTensor
    return _DTENSOR
