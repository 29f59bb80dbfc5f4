"""Weight-group membership for engines whose model lives in this process (the HF backend).

Receives a broadcast into staging buffers while generation goes on, then hands
the complete set to `apply` (which swaps it in atomically).

`apply` must copy the tensors (apply_to_module does) and not keep them: the staging
buffers are reused by the next pull (WeightReceiver(reuse_buffers=True)), which saves
an allocation and a view per tensor on every push.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

import torch

from rlfleet.devices import transfer_device
from rlfleet.errors import InvalidRequest, NotReady, WeightSyncError
from rlfleet.weights import WeightGroup, WeightReceiver
from rlfleet.weights.ipc import IpcWeightReceiver


class InProcessWeightSync:
    def __init__(self, device: torch.device, apply: Callable[[dict[str, torch.Tensor], int], None]):
        self.device = device
        self._apply = apply
        self._group: WeightGroup | None = None
        self._receiver: WeightReceiver | None = None
        self._lock = threading.Lock()  # one weight pull at a time

    def join(self, address: str, rank: int, world_size: int, backend: str, timeout_s: float,
             token: str | None = None) -> None:
        # The store connect can take the whole timeout: made outside the lock, so a join to an
        # address that does not answer never holds up a pull of the current group.
        if backend == "ipc" and self.device.type != "cuda":
            raise InvalidRequest(f"weight backend 'ipc' needs the rollout on the learner's GPU; it is on "
                                 f"{self.device}")
        group = WeightGroup.join(address, rank=rank, world_size=world_size,
                                 backend="gloo" if backend == "ipc" else backend, timeout_s=timeout_s,
                                 device=transfer_device(backend, self.device), token=token)
        receiver = (IpcWeightReceiver(group, self.device) if backend == "ipc"
                    else WeightReceiver(group, reuse_buffers=True))
        with self._lock:
            if self._group is not None:
                self._group.close()
            self._group, self._receiver = group, receiver

    def pull(self, version: int) -> dict[str, float]:
        """Receives the broadcast of `version` and swaps it in; generation keeps serving the old
        version until the swap, which waits for the chunk being generated."""
        with self._lock:
            if self._group is None or self._receiver is None:
                raise NotReady("not in a weight group: call JoinWeightGroup first")
            start = time.perf_counter()
            try:
                with self._group.bounded():  # one group timeout for the whole pull
                    self._group.connect()
                    received = self._receiver.receive(expected_version=version)
            except WeightSyncError:
                self._group.close()
                self._group, self._receiver = None, None
                raise
            self._apply(received.tensors, received.version)
            return {"version": received.version, "bytes": received.nbytes,
                    "seconds": time.perf_counter() - start}
