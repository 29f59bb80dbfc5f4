"""Weight handoff between processes on one GPU by CUDA IPC: no trip through host memory.

Why: on a one-GPU host the learner and the rollout share the device, NCCL cannot put two ranks
on one GPU, and gloo moves every version GPU -> host -> GPU (0.6-0.9 s for a 135M model). Here
the learner packs its weights into flat buffers it keeps for the run and exports them once as
CUDA IPC handles; a push sends only a small header over the weight group (gloo, CPU), and each
rollout copies the buffers device-to-device into its own staging buffers, then acknowledges.

Why the control messages still travel over the weight group: it is the transaction the
broadcast path has (rendezvous, the token's admission, version, layout digest and optional
checksums), so a process without the token never receives a handle, and a push that a member
cannot follow fails on every rank alike.

Why the rollout copies before it acknowledges, instead of reading the learner's buffers
in place: the swap into the model waits for the generation chunk in flight, and the learner
must not wait for generation; after the acknowledgement the learner may repack its buffers.

Why the handles are JSON and not pickles: a pickle received from another process runs code.
"""
from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterable

import torch

from rlfleet.devices import CUDA_CAPTURE_EXCLUSIVE
from rlfleet.errors import WeightSyncError
from rlfleet.weights.group import WeightGroup
from rlfleet.weights.manifest import (FLAG_CHECKSUMS, HEADER_WORDS, Manifest, checksum, decode_header,
                                      dtype_from_name, dtype_name, encode_header)
from rlfleet.weights.receiver import ReceivedWeights, WeightReceiver
from rlfleet.weights.sender import WeightSender

#: one bucket per dtype: the buffers are exported once, so there is nothing to gain from smaller ones
IPC_BUCKET_BYTES = 1 << 62
_EXPORT_FORMAT = 1


def gpu_uuid(device: torch.device) -> str:
    """The physical GPU behind `device` (indices differ between processes with other
    CUDA_VISIBLE_DEVICES; the UUID does not)."""
    return str(torch.cuda.get_device_properties(device).uuid)


def export_handles(buffers: list[torch.Tensor], export_id: int) -> bytes:
    """JSON naming each flat buffer's CUDA allocation, for import_handles() in another process."""
    entries = []
    for buf in buffers:
        if buf.numel() == 0:
            entries.append(None)
            continue
        (_, handle, size, offset, counter, counter_offset, event, event_sync) = \
            buf.untyped_storage()._share_cuda_()
        entries.append({"handle": _b64(handle), "size": size, "offset": offset, "counter": _b64(counter),
                        "counter_offset": counter_offset, "event": _b64(event),
                        "event_sync": bool(event_sync),
                        "storage_offset": buf.storage_offset(), "numel": buf.numel(),
                        "dtype": dtype_name(buf.dtype)})
    return json.dumps({"format": _EXPORT_FORMAT, "id": export_id, "gpu": gpu_uuid(buffers[0].device)
                       if buffers else "", "buffers": entries}).encode()


def import_handles(data: bytes, device: torch.device) -> tuple[int, list[torch.Tensor]]:
    """Maps the learner's buffers into this process; (export id, flat tensors on `device`)."""
    try:
        spec = json.loads(data)
        if spec.get("format") != _EXPORT_FORMAT:
            raise ValueError(f"export format {spec.get('format')!r}, expected {_EXPORT_FORMAT}")
        here = gpu_uuid(device)
        if spec["gpu"] != here:
            raise ValueError(f"the learner's buffers are on GPU {spec['gpu']}, this process is on {here} "
                             f"({device}); CUDA IPC weight handoff needs one GPU (learner.weight_backend)")
        torch.cuda._lazy_init()
        buffers = []
        for entry in spec["buffers"]:
            if entry is None:
                buffers.append(torch.empty(0, device=device))
                continue
            storage = torch.UntypedStorage._new_shared_cuda(
                device.index, _unb64(entry["handle"]), entry["size"], entry["offset"],
                _unb64(entry["counter"]), entry["counter_offset"], _unb64(entry["event"]),
                entry["event_sync"])
            flat = torch.empty(0, dtype=dtype_from_name(entry["dtype"]), device=device)
            flat.set_(storage, entry["storage_offset"], (entry["numel"],))
            buffers.append(flat)
        return int(spec["id"]), buffers
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise WeightSyncError(f"cannot map the learner's CUDA IPC weight buffers: {exc}") from exc


def _b64(raw: bytes | None) -> str | None:
    return None if raw is None else base64.b64encode(raw).decode()


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def _bytes_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


class IpcWeightSender(WeightSender):
    """Rank 0 of a gloo weight group whose members share the learner's GPU."""

    def __init__(self, group: WeightGroup, device: torch.device, checksums: bool = False) -> None:
        if group.backend != "gloo" or group.device.type != "cpu":
            raise ValueError("the IPC handoff's control messages travel over a gloo group on the CPU")
        super().__init__(group, bucket_bytes=IPC_BUCKET_BYTES, checksums=checksums)
        self.cuda_device = device
        self._exported: tuple[tuple[int, ...], list[torch.Tensor], bytes] | None = None
        self._export_id = 0

    def push(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> dict:
        start = time.perf_counter()
        named = named_tensors if isinstance(named_tensors, list) else list(named_tensors)
        plan = self._plan_for(named)
        buffers, export = self._buffers(plan)
        srcs = [t for _, t in named]
        self.packed = 0
        for b, buf in enumerate(buffers):
            if buf.numel():
                self._pack(plan, b, srcs, out=buf)
        sums = [checksum(buf) for buf in buffers] if self.checksums else None
        torch.cuda.synchronize(self.cuda_device)  # the buffers are complete before any member reads them
        packed_s = time.perf_counter() - start
        group = self.group
        send_layout = group.cache.get("sent_layout") != plan.digest
        send_export = group.cache.get("sent_export") != self._export_id
        words = encode_header(version, len(plan.layout.buckets), len(plan.data) if send_layout else 0,
                              FLAG_CHECKSUMS if sums is not None else 0, plan.digest)
        header = torch.tensor([*words, len(export) if send_export else 0], dtype=torch.int64)
        group.broadcast(header)
        if send_layout:
            group.broadcast(_bytes_tensor(plan.data))
        if send_export:
            group.broadcast(_bytes_tensor(export))
        if sums is not None:
            group.broadcast(torch.tensor([w for pair in sums for w in pair], dtype=torch.int64))
        failed = group.all_reduce_sum(torch.zeros(1, dtype=torch.int64)).item()
        group.cache["sent_layout"], group.cache["sent_export"] = plan.digest, self._export_id
        if failed:
            raise WeightSyncError(f"weights version {version}: {failed} member(s) could not map or copy the "
                                  "learner's CUDA IPC buffers (see their logs)")
        return {"version": version, "bytes": plan.layout.total_bytes,
                "manifest_bytes": len(plan.data) if send_layout else 0, "buckets": len(buffers),
                "tensors": len(plan.layout.entries), "pack_seconds": packed_s, "transport": "ipc",
                "seconds": time.perf_counter() - start}

    def _buffers(self, plan) -> tuple[list[torch.Tensor], bytes]:
        """The exported buffers of this layout (allocated and exported once per layout)."""
        if self._exported is not None and self._exported[0] == plan.digest:
            return self._exported[1], self._exported[2]
        self._exported = None
        buffers = [torch.empty(spec.numel, dtype=dtype_from_name(spec.dtype), device=self.cuda_device)
                   for spec in plan.layout.buckets]
        self._export_id += 1
        self._exported = (plan.digest, buffers, export_handles(buffers, self._export_id))
        return buffers, self._exported[2]


class IpcWeightReceiver(WeightReceiver):
    """A member of the group on the learner's GPU: maps the exported buffers once and copies
    each version out of them into its own staging buffers (valid until the next receive)."""

    def __init__(self, group: WeightGroup, device: torch.device) -> None:
        super().__init__(group, reuse_buffers=True)
        self.cuda_device = device
        self._mapped: tuple[int, list[torch.Tensor]] | None = None

    def _staging_device(self) -> torch.device:
        return self.cuda_device

    def receive(self, expected_version: int | None = None) -> ReceivedWeights:
        group = self.group
        header = torch.empty(HEADER_WORDS + 1, dtype=torch.int64)
        group.broadcast(header)
        words = header.tolist()
        version, nbuckets, layout_len, flags, digest = decode_header(words[:HEADER_WORDS])
        export_len = words[HEADER_WORDS]
        layout = self._layout(digest, layout_len)
        if nbuckets != len(layout.buckets):
            group.fail(f"push header names {nbuckets} buckets, its layout has {len(layout.buckets)}")
        export = None
        if export_len:
            if not 0 < export_len <= 1 << 24:
                group.fail(f"IPC export length {export_len} is out of range")
            raw = torch.empty(export_len, dtype=torch.uint8)
            group.broadcast(raw)
            export = raw.numpy().tobytes()
        sums = None
        if flags & FLAG_CHECKSUMS:
            sums = torch.empty(2 * nbuckets, dtype=torch.int64)
            group.broadcast(sums)
        error: Exception | None = None
        try:
            with CUDA_CAPTURE_EXCLUSIVE:  # it synchronizes the device: never during a graph capture
                buckets, tensors = self._copy_out(digest, layout, export)
        except WeightSyncError as exc:
            error = exc
        except Exception as exc:  # a CUDA error too: the learner must hear of it, not wait out its timeout
            error = WeightSyncError(f"copying the learner's CUDA IPC buffers failed: {exc}")
        # Everyone acknowledges, failed or not, so that no rank is left waiting in the collective.
        group.all_reduce_sum(torch.tensor([1 if error else 0], dtype=torch.int64))
        if error is not None:
            raise error
        return self._verified(version, expected_version, layout, sums, buckets, tensors)

    def _copy_out(self, digest: tuple[int, ...], layout: Manifest,
                  export: bytes | None) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
        if export is not None:
            self._mapped = None  # unmap the old export before mapping the new one
            self._mapped = import_handles(export, self.cuda_device)
        if self._mapped is None:
            raise WeightSyncError("the learner sent no CUDA IPC export and this rank has mapped none")
        sources = self._mapped[1]
        if [s.numel() for s in sources] != [spec.numel for spec in layout.buckets]:
            raise WeightSyncError("the learner's CUDA IPC buffers do not match the weight layout")
        buckets, tensors = self._buffers(digest, layout)
        for dst, src in zip(buckets, sources):
            if dst.numel():
                dst.copy_(src)
        torch.cuda.synchronize(self.cuda_device)  # copied before the learner may repack its buffers
        return buckets, tensors
