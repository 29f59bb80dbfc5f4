"""The stall watchdog: a run that trains no step for too long stops with one line naming why.

The loop tells it when a step trained (`trained`) and how long it spent re-forming the weight group
or pushing weights while it waited for a batch (`waited`); while it waits for groups it asks
`expired()`, which returns the error that stops the run once no step has trained for the limit:

    limit = max(controller.max_stall_s, STEP_FACTOR x the median time of the last RECENT_STEPS steps)

so the default (a few minutes) holds until steps run, and a job whose steps take minutes each is not
stopped for being slow (a step's time runs from the end of the one before to its own end: waiting for
its groups, training, the weight push). The median, not the slowest: one step slowed by an outage
that was waited out does not raise the limit for the rest of the run. The clock runs from the end of
the last step (or the start of training).
An outage (reward or environment) is waited out by its own bound (reward.max_outage_s,
env.max_outage_s), and a replica down or an empty fleet by controller.service_wait_s, not by this
one: while one of them lasts the loop calls `hold()`, and the clock stops until it asks `expired()`
again (a replica that fails again and again still stalls the run: the time between is counted).

The line (`StallFacts.describe`) names what the loop saw since the last step: groups dropped and
why, environment failures by cause and the last error, rewards that failed, the replicas live, the
prompts in flight and the groups buffered, time spent on the weight group, and whether admission is
paused.
"""
from __future__ import annotations

import statistics
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from rlfleet.errors import RlfleetError

STEP_FACTOR = 10.0  # the limit is at least this many times the median step time
RECENT_STEPS = 20  # steps whose times the median is taken over

# why a dropped group was left out, in words (controller/loop.py _take_batch's reasons)
DROP_REASONS = {"unusable": "fewer than 2 samples with a reward",
                "stale": "older than controller.max_staleness",
                "filtered": "equal rewards (dynamic sampling)"}


class RunStalled(RlfleetError, TimeoutError):
    """No step trained for longer than the stall limit (controller.max_stall_s)."""


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{key} {n}" for key, n in counter.most_common())


@dataclass
class StallFacts:
    """What the loop saw since its last step (or since training started)."""

    dropped: Counter[str] = field(default_factory=Counter)  # groups, by reason
    dropped_samples: int = 0
    env_failed: Counter[str] = field(default_factory=Counter)  # episodes, by cause
    env_last_error: str = ""
    env_note: str = ""  # e.g. an OpenEnv server's sessions against what a group needs
    reward_failed_items: int = 0
    replicas: int = 0
    in_flight: int = 0  # prompts admitted, neither trained nor dropped
    buffered: int = 0  # groups scored and waiting for a batch
    paused: str = ""  # why admission is paused, if it is
    waited: Counter[str] = field(default_factory=Counter)  # seconds spent on the weight group, by what

    def describe(self) -> str:
        parts = []
        if self.dropped:
            reasons = "; ".join(f"{reason} {n}: {DROP_REASONS.get(reason, reason)}"
                                for reason, n in self.dropped.most_common())
            parts.append(f"{sum(self.dropped.values())} groups dropped ({reasons}; "
                         f"{self.dropped_samples} samples)")
        else:
            parts.append("no group came back to train on")
        if self.env_failed:
            parts.append(f"environment episodes failed: {_counts(self.env_failed)}"
                         + (f" (last: {self.env_last_error[:300]})" if self.env_last_error else ""))
        if self.env_note:
            parts.append(self.env_note)
        if self.reward_failed_items:
            parts.append(f"{self.reward_failed_items} samples got no reward")
        parts.append("no rollout replica in the fleet" if self.replicas == 0 else
                     f"{self.replicas} rollout replica{'s' if self.replicas != 1 else ''} live")
        parts.append(f"{self.in_flight} prompts in flight, {self.buffered} groups buffered")
        for what, seconds in self.waited.most_common():
            parts.append(f"{seconds:.0f}s spent on {what}")
        if self.paused:
            parts.append(f"admission paused: {self.paused}")
        return "; ".join(parts)


class StallWatchdog:
    def __init__(self, max_stall_s: float, clock: Callable[[], float] = time.monotonic):
        self.max_stall_s, self.clock = max_stall_s, clock
        self.since = clock()
        self._step_s: deque[float] = deque(maxlen=RECENT_STEPS)
        self.waited: Counter[str] = Counter()
        self._held_at: float | None = None

    def restart(self) -> None:
        """Training starts now (after the initial weight sync and evaluation)."""
        self.since, self._held_at = self.clock(), None

    def hold(self) -> None:
        """The loop waits out something bounded elsewhere: the clock stops until the next `expired()`."""
        if self._held_at is None:
            self._held_at = self.clock()

    def trained(self, step_s: float) -> None:
        """A step trained, taking `step_s` seconds: the clock starts again."""
        self._step_s.append(step_s)
        self.since, self._held_at = self.clock(), None
        self.waited.clear()

    def waited_on(self, what: str, seconds: float) -> None:
        """Time the loop spent on `what` (a weight push, a re-form) while it waited for a batch."""
        if seconds > 0:
            self.waited[what] += seconds

    def step_s(self) -> float:
        """The median time of the last steps (0 before any)."""
        return statistics.median(self._step_s) if self._step_s else 0.0

    def limit_s(self) -> float:
        return max(self.max_stall_s, STEP_FACTOR * self.step_s())

    def expired(self, facts: Callable[[], StallFacts]) -> RunStalled | None:
        """The error that stops the run once no step trained for `limit_s()`; `facts` is called then."""
        if self._held_at is not None:  # the time held does not count
            self.since += self.clock() - self._held_at
            self._held_at = None
        stalled = self.clock() - self.since
        limit = self.limit_s()
        if stalled <= limit:
            return None
        seen = facts()
        seen.waited = self.waited
        rule = (f"controller.max_stall_s={self.max_stall_s:g}" if limit == self.max_stall_s else
                f"{STEP_FACTOR:g}x the median step, {self.step_s():.1f}s")
        return RunStalled(f"no step trained for {stalled:.0f}s (limit {limit:.0f}s: {rule}): "
                          f"{seen.describe()}")
