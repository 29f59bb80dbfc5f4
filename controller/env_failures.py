"""The environment's failed episodes, as the controller sees them: counted, logged, and the run stopped
when the environment fails everything.

* **A budget**: after `env.max_consecutive_failures` episodes in a row failed, the run stops
  (EnvironmentFailing) with one line naming the server, the failures by cause and the last error,
  rather than generating for ever for nothing. `unavailable` is left out of the count (neither
  counted nor resetting it): the environment outage (controller/env_outage.py) bounds it by
  `env.max_outage_s`. Any episode the environment answered resets the count.
* **Logs**: the first failure of each cause is logged with its error; after that, a count per cause
  at most once a minute (`report_every_s`), so a failing environment is visible during training
  without a line per episode.
* **Totals** for `rlfleet status`: episodes, failures by cause, the last error.
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable

import structlog

from rlfleet.env.types import UNAVAILABLE
from rlfleet.errors import RlfleetError
from rlfleet.types import Completion

log = structlog.get_logger(__name__)


class EnvironmentFailing(RlfleetError, RuntimeError):
    """Too many episodes in a row failed (env.max_consecutive_failures)."""


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{cause} {n}" for cause, n in counter.most_common())


class EnvFailures:
    def __init__(self, address: str, max_consecutive: int, clock: Callable[[], float] = time.monotonic,
                 report_every_s: float = 60.0):
        self.address, self.max_consecutive = address, max_consecutive
        self.clock, self.report_every_s = clock, report_every_s
        self._lock = threading.Lock()
        self.episodes = 0  # over the whole run
        self.failed: Counter[str] = Counter()  # over the whole run, by cause
        self.last_error = ""
        self._streak: Counter[str] = Counter()  # the current run of failures in a row, by cause
        self._seen: set[str] = set()  # causes whose first failure was logged
        self._unreported: Counter[str] = Counter()
        self._reported_at = clock()

    @property
    def consecutive(self) -> int:
        return sum(self._streak.values())

    def add(self, completions: Iterable[Completion]) -> None:
        """A group's episodes; raises EnvironmentFailing once the budget is spent."""
        with self._lock:
            for c in completions:
                self.episodes += 1
                if not c.failed:
                    self._streak.clear()
                    continue
                cause = c.env_failure or "unknown"
                self.failed[cause] += 1
                self.last_error = c.env_error
                if cause != UNAVAILABLE:
                    self._streak[cause] += 1
                if cause not in self._seen:
                    self._seen.add(cause)
                    log.warning(f"environment {self.address}: an episode failed ({cause}): {c.env_error}; "
                                "further failures are counted once a minute")
                else:
                    self._unreported[cause] += 1
                limit = self.max_consecutive
                if limit and self.consecutive >= limit:
                    raise EnvironmentFailing(
                        f"environment {self.address}: {self.consecutive} episodes in a row failed "
                        f"({_counts(self._streak)}; env.max_consecutive_failures={limit}); "
                        f"last: {c.env_error}")
        self.report()

    def report(self) -> None:
        """Logs the failures not yet reported, once `report_every_s` passed since the last report."""
        with self._lock:
            now = self.clock()
            if not self._unreported or now - self._reported_at < self.report_every_s:
                return
            counts, since = _counts(self._unreported), now - self._reported_at
            self._unreported.clear()
            self._reported_at = now
        log.warning(f"environment {self.address}: episodes failed in the last {since:.0f}s: {counts}")

    def snapshot(self) -> dict[str, object]:
        """Totals over the run, for the controller's status."""
        with self._lock:
            return {"episodes": self.episodes, "failed": dict(self.failed), "last_error": self.last_error}
