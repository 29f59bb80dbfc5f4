"""A bound on the samples a run writes that it did not train on: at most `per_window` records every
`window_s` seconds, whatever the steps do (a run whose groups are all dropped trains no step, and
would otherwise write every failed episode: 19.7 MB in 4 minutes, issue 42)."""
from __future__ import annotations

import time
from collections.abc import Callable


class SampleQuota:
    def __init__(self, per_window: int = 64, window_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic):
        self.per_window, self.window_s, self.clock = per_window, window_s, clock
        self._window_start = clock()
        self._used = 0
        self.offered = 0  # records offered over the run
        self.written = 0  # records allowed over the run

    def take(self, wanted: int) -> int:
        """How many of `wanted` records may be written now."""
        now = self.clock()
        if now - self._window_start >= self.window_s:
            self._window_start, self._used = now, 0
        allowed = max(0, min(wanted, self.per_window - self._used))
        self._used += allowed
        self.offered += wanted
        self.written += allowed
        return allowed
