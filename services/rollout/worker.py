"""Rollout core: an engine plus its membership in the learner's weight group."""
from __future__ import annotations

import threading
import time

from rlfleet.devices import transfer_device
from rlfleet.errors import NotReady, WeightSyncError
from rlfleet.weights import WeightGroup, WeightReceiver
from services.rollout.engine import RolloutEngine


class RolloutWorker:
    def __init__(self, engine: RolloutEngine):
        self.engine = engine
        self._group: WeightGroup | None = None
        self._receiver: WeightReceiver | None = None
        self._lock = threading.Lock()  # one weight pull at a time

    def join_weight_group(self, address: str, rank: int, world_size: int, backend: str, timeout_s: float) -> None:
        with self._lock:
            if self._group is not None:
                self._group.close()
            self._group = WeightGroup.join(address, rank=rank, world_size=world_size, backend=backend,
                                           timeout_s=timeout_s,
                                           device=transfer_device(backend, self.engine.device))
            self._receiver = WeightReceiver(self._group)

    def pull_weights(self, version: int, digest: bool = False) -> dict[str, float | str]:
        """Receives the broadcast of `version` and swaps it in; generation keeps serving the old
        version until the swap, which waits for the chunk being generated."""
        with self._lock:
            if self._group is None or self._receiver is None:
                raise NotReady("not in a weight group: call JoinWeightGroup first")
            start = time.perf_counter()
            try:
                self._group.connect()
                received = self._receiver.receive(expected_version=version)
            except WeightSyncError:
                self._group.close()
                self._group, self._receiver = None, None
                raise
            self.engine.apply_weights(received.tensors, received.version)
            nbytes = sum(t.numel() * t.element_size() for t in received.tensors.values())
            stats = {"version": received.version, "bytes": nbytes, "seconds": time.perf_counter() - start}
            if digest:
                stats["digest"] = self.engine.weights_digest()
            return stats
