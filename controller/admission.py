"""Admission as a FIFO hand-off: a member waiting for work is an entry in a queue, woken only when
there is work for it (or it must stop waiting), never one of a herd.

Before, every generation thread waited on one condition, and every notify (a scored batch, a dropped
group, a new version) woke all of them: each re-took the lock, re-checked the gate and waited again,
O(N) wake-ups per notify and O(N^2) per step's burst of free slots at N replicas (issue 44). Now whoever
changes what admission allows hands the work out itself, in the order the members asked, and wakes
only the members it gave work to. Every method is called with the loop's lock held; a waiter is a
member's task on the controller's event loop (controller/generation.py), woken thread-safely.
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

Work = TypeVar("Work")

# The first waiter re-checks admission this often: an environment outage's trial comes due with time,
# not with a notify. The others only look whether they must stop waiting (a safety net: a stop or a
# leave also wakes them at once).
HEAD_POLL_S = 0.5
IDLE_POLL_S = 5.0


class Waiter(Generic[Work]):
    """A member waiting for work: `work` is set by whoever hands it out, who then wakes it through the
    queue's `wake` (with `signal`, what the member's task awaits now: set by that task)."""

    def __init__(self, member: object) -> None:
        self.member = member
        self.signal: Any = None
        self.work: Work | None = None
        self.joined_at = time.perf_counter()
        self.handed_at = 0.0  # time.perf_counter() when the work was handed to it
        self.queued = True  # in the queue (taken off when handed work or woken without)

    def held_s(self) -> float:
        """Seconds it waited for admission: from asking until its work was handed out (not until its
        task woke up to take it, which is the controller's own latency)."""
        return self.handed_at - self.joined_at


class AdmissionQueue(Generic[Work]):
    """The members waiting for work, first come first served. `wake(waiters)`: wakes those members,
    from any thread; called once per hand-out with all it woke (one call into the event loop for a
    burst of N, not N)."""

    def __init__(self, wake: Callable[[list[Waiter[Work]]], None]) -> None:
        self._wake_all = wake
        self._waiting: deque[Waiter[Work]] = deque()
        self._to_wake: list[Waiter[Work]] = []
        self.wakeups = 0  # times a waiting member was woken (a herd would show here)

    def __len__(self) -> int:
        return len(self._waiting)

    def join(self, member: object) -> Waiter[Work]:
        waiter: Waiter[Work] = Waiter(member)
        self._waiting.append(waiter)
        return waiter

    def rejoin(self, waiter: Waiter[Work]) -> None:
        """A waiter woken without work that still waits goes to the back of the queue again."""
        if not waiter.queued:
            waiter.queued = True
            self._waiting.append(waiter)

    def leave(self, waiter: Waiter[Work]) -> None:
        if waiter.queued:  # it stops waiting without work (the loop stops, its member leaves)
            waiter.queued = False
            self._waiting.remove(waiter)

    def _take_off(self, waiter: Waiter[Work]) -> None:
        waiter.queued = False
        self._to_wake.append(waiter)

    def _flush(self) -> None:
        if self._to_wake:
            woken, self._to_wake = self._to_wake, []
            self.wakeups += len(woken)
            self._wake_all(woken)

    def hand_out(self, next_work: Callable[[], Work | None], takes_work: Callable[[object], bool],
                 sweep: bool = False) -> int:
        """Hands work to the waiters in order while `next_work` has some; a waiter whose member takes
        no more work is woken without (it leaves the queue itself): each one found at the front, and
        with `sweep` (the fleet changed) all of them. Returns how many got work."""
        if sweep and not all(takes_work(w.member) for w in self._waiting):
            kept: deque[Waiter[Work]] = deque()
            for waiter in self._waiting:
                if takes_work(waiter.member):
                    kept.append(waiter)
                else:
                    self._take_off(waiter)
            self._waiting = kept
        head = self._waiting[0] if self._waiting else None
        handed = 0
        while self._waiting:
            if not takes_work(self._waiting[0].member):
                self._take_off(self._waiting.popleft())
                continue
            work = next_work()
            if work is None:
                break
            waiter = self._waiting.popleft()
            waiter.work, waiter.handed_at = work, time.perf_counter()
            self._take_off(waiter)
            handed += 1
        if self._waiting and self._waiting[0] is not head:
            self._to_wake.append(self._waiting[0])  # the new first waiter takes over the polling
        self._flush()
        return handed

    def dismiss_all(self) -> None:
        """Wakes every waiter without work (the loop stops)."""
        while self._waiting:
            self._take_off(self._waiting.popleft())
        self._flush()

    def is_first(self, waiter: Waiter[Work]) -> bool:
        return bool(self._waiting) and self._waiting[0] is waiter
