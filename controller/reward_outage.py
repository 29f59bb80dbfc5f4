"""Whether rewards can be had right now: the controller's reward outage, as a small state machine.

    SCORING --Score failed with ServiceUnavailable--> OUTAGE(since, cause)
    OUTAGE  --a Score call succeeded----------------> SCORING
    OUTAGE  --reward.max_outage_s passed------------> raises RewardOutageExpired (the run stops)

ServiceUnavailable is what the reward client raises when the reward service cannot be reached,
and what the service answers when one of its `reward.sources` cannot score (unreachable, circuit
open; services/reward/sources/remote_client.py): no sample can get a reward then. During an outage the
loop admits no new prompts, groups already generated wait (at most the admitted ones) and their
scoring is retried; nothing is counted as a sample without a reward. One warning when an outage
begins and one when it ends, however many groups wait.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

import structlog

from rlfleet.errors import RewardError, ServiceUnavailable

log = structlog.get_logger(__name__)

SCORING, OUTAGE = "scoring", "outage"


class RewardOutageExpired(RewardError):
    """No reward source could score for longer than reward.max_outage_s."""


class RewardOutage:
    def __init__(self, max_outage_s: float, clock: Callable[[], float] = time.monotonic,
                 on_change: Callable[[str, dict], None] | None = None):
        """`on_change(state, fields)`: told of every state change (the journal records it)."""
        self.max_outage_s = max_outage_s
        self.clock = clock
        self.on_change = on_change
        self._lock = threading.Lock()
        self.state = SCORING
        self.since = 0.0
        self.cause = ""
        self.outages = 0  # outages so far

    def blocked(self) -> bool:
        """Whether admission is paused."""
        return self.state == OUTAGE

    def failed(self, exc: ServiceUnavailable) -> None:
        """A Score call found no reward source able to score; raises RewardOutageExpired once the
        outage is older than max_outage_s."""
        with self._lock:
            self.cause = str(exc)
            began = self.state == SCORING
            if began:
                # Journalled first, then admission pauses: each change is in the journal before
                # admission acts on it (the lock keeps a second failure from telling it again).
                self._tell(OUTAGE, cause=self.cause[:300])
                self.state, self.since = OUTAGE, self.clock()
                self.outages += 1
            lasted = self.clock() - self.since
        if began:
            log.warning(f"reward outage: no reward source can score ({self.cause}); admission paused, "
                        f"generated groups wait; the run stops if this lasts reward.max_outage_s="
                        f"{self.max_outage_s:g}s")
        if lasted > self.max_outage_s:
            raise RewardOutageExpired(f"no reward for {lasted:.0f}s (reward.max_outage_s="
                                      f"{self.max_outage_s:g}): {self.cause}")

    def recovered(self) -> None:
        with self._lock:
            if self.state == SCORING:
                return
            lasted = self.clock() - self.since
            self._tell(SCORING, outage_s=round(lasted, 3))  # journalled before admission resumes
            self.state = SCORING
        log.warning(f"reward outage over after {lasted:.1f}s; admission resumes")

    def _tell(self, state: str, **fields) -> None:
        """Called with the lock held, before the state changes: `on_change` must not call back."""
        if self.on_change is not None:
            self.on_change(state, fields)
