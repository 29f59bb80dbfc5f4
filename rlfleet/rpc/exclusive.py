"""One weight operation at a time per service, refused rather than queued.

A weight-group join, pull or push can wait for its whole timeout (a store that does not
answer, ranks that never connect). Queued behind a lock, every further call held a thread
of the server's pool, and 20 of them starved health and Generate for over a minute
(issue 15). A second call while one runs now gets RESOURCE_EXHAUSTED at once.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from rlfleet.errors import Busy


class Exclusive:
    def __init__(self, what: str):
        self.what = what
        self._lock = threading.Lock()
        self._running = ""

    @property
    def running(self) -> str:
        """The call that holds it now, "" when none does."""
        return self._running if self._lock.locked() else ""

    def refuse_while_held(self, call: str) -> None:
        """For calls that must not run alongside the operation (a Train during a weight push, which
        reads the weights it would change) and must not queue behind it either (issue 22)."""
        running = self._running
        if self._lock.locked() and running:
            raise Busy(f"{call} refused: {running} is in progress on this {self.what}; retry after it ends")

    @contextmanager
    def hold(self, call: str, wait_s: float = 0.0) -> Iterator[None]:
        """Runs `call` alone; Busy when another operation holds it, at once or (`wait_s` > 0, for a call
        that already holds a server thread and must not fail on a short overlap) after `wait_s`."""
        taken = self._lock.acquire(timeout=wait_s) if wait_s > 0 else self._lock.acquire(blocking=False)
        if not taken:
            raise Busy(f"{call} refused: {self._running or 'another operation'} is in progress on this "
                       f"{self.what}; retry after it ends")
        self._running = call
        try:
            yield
        finally:
            self._running = ""
            self._lock.release()
