"""Rollout side of a weight push: receive, verify, and hand back tensors.

Why receive() does not touch the model: the rollout engine must swap weights
atomically between generation steps, so it decides when; receive() only returns
verified tensors (views into the received buckets), and ``apply_to_module``
copies them in once every name and shape has been checked.

Why a version or checksum mismatch still drains every bucket: a broadcast is a
collective, so a receiver that stopped early would stall the learner and every
other worker. Draining keeps the group aligned for the next push.

Why ``reuse_buffers``: allocating the receive buckets and slicing 290 views out of
them on every push is a fixed cost that a small model feels. A caller that copies
the tensors out before its next receive() (apply_to_module does) can keep the
buckets and views for as long as the layout holds. It is off by default because a
consumer that kept a reference to a received tensor (rather than copying it) would
see it overwritten by the next push.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rlfleet.errors import VersionMismatch, WeightSyncError
from rlfleet.weights.group import WeightGroup
from rlfleet.weights.manifest import (FLAG_CHECKSUMS, HEADER_WORDS, Manifest, checksum, decode_header,
                                      dtype_from_name, layout_digest)
from rlfleet.weights.naming import model_weights

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

    def __init__(self, group: WeightGroup, reuse_buffers: bool = False) -> None:
        if group.rank == 0:
            raise ValueError("WeightReceiver runs on ranks 1..N; rank 0 is the sender")
        self.group = group
        self.reuse_buffers = reuse_buffers
        self._staging: tuple[tuple[int, ...], list[torch.Tensor], dict[str, torch.Tensor]] | None = None

    def _staging_device(self) -> torch.device:
        """Where received buckets live: the group's device (a subclass may stage elsewhere)."""
        return self.group.device

    def receive(self, expected_version: int | None = None) -> ReceivedWeights:
        """Block for one push. Raises VersionMismatch, or WeightSyncError on timeout/corruption.

        With ``reuse_buffers`` the returned tensors are valid until the next receive()."""
        group, device = self.group, self.group.device
        header = torch.empty(HEADER_WORDS, dtype=torch.int64, device=device)
        group.broadcast(header)
        version, nbuckets, layout_len, flags, digest = decode_header(header.tolist())  # the one host sync
        layout = self._layout(digest, layout_len)
        if nbuckets != len(layout.buckets):
            group.fail(f"push header names {nbuckets} buckets, its layout has {len(layout.buckets)}")
        sums = torch.empty(2 * nbuckets, dtype=torch.int64, device=device) if flags & FLAG_CHECKSUMS else None
        buckets, tensors = self._buffers(digest, layout)
        # All receives issued at once; they complete in order.
        works = [group.start_broadcast(sums)] if sums is not None else []
        works += [group.start_broadcast(buf.view(torch.uint8)) for buf in buckets if buf.numel()]
        for work in works:
            group.finish(work)
        return self._verified(version, expected_version, layout, sums, buckets, tensors)

    @staticmethod
    def _verified(version: int, expected_version: int | None, layout: Manifest, sums: torch.Tensor | None,
                  buckets: list[torch.Tensor], tensors: dict[str, torch.Tensor]) -> ReceivedWeights:
        """The received version, once its number and (when sent) its bucket checksums are checked."""
        pairs = None
        if sums is not None:
            words = sums.tolist()
            pairs = [(words[2 * i], words[2 * i + 1]) for i in range(len(layout.buckets))]
        manifest = layout.with_push(version, pairs)
        if expected_version is not None and version != expected_version:
            raise VersionMismatch(f"expected weights version {expected_version}, learner sent {version}")
        if pairs is not None:
            bad = [i for i, (spec, buf) in enumerate(zip(manifest.buckets, buckets))
                   if checksum(buf) != spec.checksum]
            if bad:
                detail = ", ".join(f"bucket {i} ({manifest.buckets[i].dtype}, {manifest.buckets[i].nbytes} B)"
                                   for i in bad)
                raise WeightSyncError(f"weights version {version}: checksum mismatch in {detail}")
        return ReceivedWeights(version, dict(tensors), manifest, manifest.total_bytes, buckets)

    def _layout(self, digest: tuple[int, ...], layout_len: int) -> Manifest:
        """The layout named by the header: received now, or the one this group generation already saw."""
        group = self.group
        if layout_len == 0:
            known = group.cache.get("layout")
            if known is None or known[0] != digest:
                # Nothing tells us the bucket sizes, so we cannot drain: the group must be rebuilt.
                group.fail("the learner sent no layout and this rank has not seen the one it names")
            return known[1]
        if not 0 < layout_len <= MAX_MANIFEST_BYTES:
            group.fail(f"weight manifest length {layout_len} is out of range")
        raw = torch.empty(layout_len, dtype=torch.uint8, device=group.device)
        group.broadcast(raw)
        data = raw.cpu().numpy().tobytes()
        if layout_digest(data) != digest:
            group.fail("the weight layout does not match the digest in its header")
        layout = Manifest.from_bytes(data)
        group.cache["layout"] = (digest, layout)
        return layout

    def _buffers(self, digest: tuple[int, ...],
                 layout: Manifest) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
        """Receive buckets and the named views into them; kept across pushes with ``reuse_buffers``."""
        if self._staging is not None and self._staging[0] == digest:
            return self._staging[1], self._staging[2]
        self._staging = None  # a new layout: let the old buffers go before allocating new ones
        device = self._staging_device()
        buckets = [torch.empty(spec.numel, dtype=dtype_from_name(spec.dtype), device=device)
                   for spec in layout.buckets]
        tensors = {e.name: buckets[e.bucket][e.offset:e.offset + e.numel].view(e.shape)
                   for e in layout.entries}
        if self.reuse_buffers:
            self._staging = (digest, buckets, tensors)
        return buckets, tensors


def apply_to_module(module: torch.nn.Module, tensors: dict[str, torch.Tensor],
                    strict: bool = True) -> list[str]:
    """Copy tensors into the module's parameters and buffers, casting dtype/device as needed.

    Everything is checked before anything is written, so a failure leaves the module
    untouched. With ``strict`` every parameter/buffer must be present and vice versa.
    The copies are grouped ``_foreach_copy_`` calls (a few launches per dtype and device
    instead of one per tensor). Returns the names that were copied.
    """
    targets: dict[str, torch.Tensor] = dict(model_weights(module))
    if strict and (len(targets) != len(tensors) or targets.keys() != tensors.keys()):
        missing = sorted(set(targets) - set(tensors))
        unexpected = sorted(set(tensors) - set(targets))
        raise WeightSyncError(f"weight names do not match the module: missing {missing[:8]}"
                              f"{'...' if len(missing) > 8 else ''}, unexpected {unexpected[:8]}"
                              f"{'...' if len(unexpected) > 8 else ''}")
    names = [name for name in tensors if name in targets]
    dsts = [targets[name] for name in names]
    srcs = [tensors[name] for name in names]
    for name, dst, src in zip(names, dsts, srcs):
        if dst.shape != src.shape:
            raise WeightSyncError(f"shape mismatch for {name!r}: module has {tuple(dst.shape)}, "
                                  f"received {tuple(src.shape)}")
    # _foreach_copy_ takes its fast (grouped) path only when every tensor in its lists shares one
    # dtype and device, so group by both sides' dtype and device; a model is usually one group.
    groups: dict[tuple, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
    for dst, src in zip(dsts, srcs):
        pair = groups.setdefault((dst.dtype, dst.device, src.dtype, src.device), ([], []))
        pair[0].append(dst)
        pair[1].append(src)
    with torch.no_grad():
        for group_dsts, group_srcs in groups.values():
            torch._foreach_copy_(group_dsts, group_srcs)
    return names
