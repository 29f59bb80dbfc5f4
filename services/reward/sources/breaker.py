"""A circuit breaker for one reward source.

Closed: calls go through. After `failures` consecutive failed calls it opens:
calls fail at once, without reaching the server, for `cooldown_s`. Then it is
half-open: one probe call goes through (others still fail at once); its success
closes the circuit, its failure opens it for another cooldown.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


class CircuitBreaker:
    def __init__(self, failures: int, cooldown_s: float, clock: Callable[[], float] = time.monotonic):
        self.failures, self.cooldown_s, self.clock = failures, cooldown_s, clock
        self._lock = threading.Lock()
        self._consecutive = 0
        self._opened_at: float | None = None
        self._probing = False
        self.opened_count = 0  # how many times it opened

    @property
    def state(self) -> str:
        with self._lock:
            return self._state()

    def _state(self) -> str:
        if self._opened_at is None:
            return CLOSED
        return HALF_OPEN if self.clock() - self._opened_at >= self.cooldown_s else OPEN

    def retry_in_s(self) -> float:
        with self._lock:
            if self._opened_at is None:
                return 0.0
            return max(0.0, self.cooldown_s - (self.clock() - self._opened_at))

    def allow(self) -> str | None:
        """CLOSED or HALF_OPEN (a probe: only one at a time) when a call may go out now, else None."""
        with self._lock:
            state = self._state()
            if state == CLOSED:
                return CLOSED
            if state == HALF_OPEN and not self._probing:
                self._probing = True
                return HALF_OPEN
            return None

    def record_success(self) -> None:
        with self._lock:
            self._consecutive = 0
            self._opened_at = None
            self._probing = False

    def record_failure(self) -> None:
        with self._lock:
            self._consecutive += 1
            if self._probing or (self._opened_at is None and self._consecutive >= self.failures):
                self._opened_at = self.clock()
                self.opened_count += 1
            self._probing = False
