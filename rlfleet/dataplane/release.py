"""Releases at data-plane servers off the caller's thread (issue 44): a replica that died without
closing its socket answers a release only with an error after gRPC's connection timeout (~20 s) or the
client's deadline, so a caller such as the learner's SaveCheckpoint must not wait for it. A few daemon
workers take (address, ids) from a queue (one silent replica holds one worker, not the others, and
not the process's exit); a failure is logged (best effort: a replica gone took its groups along)."""
from __future__ import annotations

import queue
import threading

import structlog

from rlfleet.errors import RlfleetError
from rlfleet.dataplane.flight import PayloadClient

log = structlog.get_logger(__name__)


class BackgroundReleases:
    def __init__(self, client: PayloadClient, threads: int = 4) -> None:
        self.client = client
        self._queue: queue.SimpleQueue[tuple[str, list[str]]] = queue.SimpleQueue()
        self._threads = threads
        self._started = 0
        self._lock = threading.Lock()

    def submit(self, address: str, ids: list[str]) -> None:
        with self._lock:
            if self._started < self._threads:  # started as needed
                self._started += 1
                threading.Thread(target=self._run, name="payload-release", daemon=True).start()
        self._queue.put((address, ids))

    def _run(self) -> None:
        while True:
            address, ids = self._queue.get()
            try:
                self.client.release(address, ids)
            except RlfleetError as exc:
                log.warning("data plane release failed", address=address, groups=len(ids),
                            error=str(exc)[:300])
