"""A rollout replica's background sender (issue 44): each group its servicer holds is pushed to the
learner's staging store (GenerateRequest.payload_sink) by one thread, never on the Generate stream,
which it neither delays nor fails. Groups queued for one sink go in one put. A failed put is logged
once per sink and counted; the replica keeps its own copy until released either way, so the learner
fetches at Train time whatever did not arrive (a full or restarted learner, a sink unreachable)."""
from __future__ import annotations

import threading
from collections import defaultdict, deque

import structlog

from rlfleet.errors import RlfleetError
from rlfleet.dataplane.flight import PayloadClient
from rlfleet.dataplane.store import PayloadMissing, PayloadStore

log = structlog.get_logger(__name__)

MAX_QUEUED = 4096  # groups waiting to be pushed; beyond it a group is not pushed (counted as dropped)
MAX_PER_PUT = 64  # groups in one put


class PayloadPusher:
    """Pushes groups of `store` (served at `address`, the replica's data plane) to the sinks named."""

    def __init__(self, store: PayloadStore, address: str, client: PayloadClient) -> None:
        self.store, self.address, self.client = store, address, client
        self.pushed = self.failed = self.dropped = 0  # groups
        self._queue: deque[tuple[str, str]] = deque()  # (sink, request id)
        self._busy = False
        self._cond = threading.Condition()
        self._warned: set[str] = set()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="payload-push", daemon=True)
        self._thread.start()

    def push(self, sink: str, request_id: str) -> None:
        """Queues `request_id`'s group for `sink`; returns at once."""
        with self._cond:
            if len(self._queue) >= MAX_QUEUED:
                self.dropped += 1
                return
            self._queue.append((sink, request_id))
            self._cond.notify()

    def wait_idle(self, timeout_s: float) -> bool:
        """Whether every queued group was pushed (or failed) within `timeout_s`."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue and not self._busy, timeout_s)

    def stats(self) -> dict[str, float]:
        return {"payload_pushed": float(self.pushed), "payload_push_failed": float(self.failed),
                "payload_push_dropped": float(self.dropped)}

    def close(self, wait: bool = True) -> None:
        """Stops after the put in progress (waiting for it, at most 5 s, if `wait`); the queued rest is
        not pushed."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if wait:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._busy = False
                self._cond.notify_all()
                self._cond.wait_for(lambda: self._queue or self._closed)
                if self._closed:
                    return
                taken = [self._queue.popleft() for _ in range(min(MAX_PER_PUT, len(self._queue)))]
                self._busy = True
            by_sink: dict[str, list[str]] = defaultdict(list)
            for sink, rid in taken:
                by_sink[sink].append(rid)
            for sink, ids in by_sink.items():
                self._put(sink, ids)

    def _put(self, sink: str, ids: list[str]) -> None:
        groups = {}
        for rid in ids:
            try:
                groups.update(self.store.get([rid]))
            except PayloadMissing:  # released meanwhile: nothing to push
                pass
        if not groups:
            return
        try:
            self.client.put(sink, self.address, groups)
            self.pushed += len(groups)
        except RlfleetError as exc:
            self.failed += len(groups)
            if sink not in self._warned:
                self._warned.add(sink)
                log.warning("data plane push to the learner failed; its groups are fetched at Train time "
                            "(further failures to it are counted, not logged)", sink=sink, groups=len(groups),
                            error=str(exc)[:300])
