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
from typing import Generic, TypeVar

Work = TypeVar("Work")

# The first waiter re-checks admission this often: an environment outage's trial comes due with time,
# not with a notify. The others only look whether they must stop waiting (a safety net: a stop or a
# leave also wakes them at once).
HEAD_POLL_S = 0.5
IDLE_POLL_S = 5.0


class Waiter(Generic[Work]):
    """A member waiting for work: `work` is set (and `wake` called) by whoever hands it out."""

    def __init__(self, member: object, wake: Callable[[], None]) -> None:
        self.member = member
        self.wake = wake  # from any thread, with the lock held: the member's task looks again
        self.work: Work | None = None
        self.joined_at = time.perf_counter()
        self.handed_at = 0.0  # time.perf_counter() when the work was handed to it
        self.queued = True  # in the queue (taken off when handed work or woken without)

    def held_s(self) -> float:
        """Seconds it waited for admission: from asking until its work was handed out (not until its
        task woke up to take it, which is the controller's own latency)."""
        return self.handed_at - self.joined_at


class AdmissionQueue(Generic[Work]):
    """The members waiting for work, first come first served."""

    def __init__(self) -> None:
        self._waiting: deque[Waiter[Work]] = deque()
        self.wakeups = 0  # times a waiting member was woken (a herd would show here)

    def __len__(self) -> int:
        return len(self._waiting)

    def join(self, member: object, wake: Callable[[], None]) -> Waiter[Work]:
        waiter: Waiter[Work] = Waiter(member, wake)
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
        self._wake(waiter)

    def _wake(self, waiter: Waiter[Work]) -> None:
        self.wakeups += 1
        waiter.wake()

    def hand_out(self, next_work: Callable[[], Work | None], takes_work: Callable[[object], bool]) -> int:
        """Hands work to the waiters in order while `next_work` has some; a waiter whose member takes
        no more work is woken without (it leaves the queue itself). Returns how many got work."""
        if not all(takes_work(w.member) for w in self._waiting):
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
            work = next_work()
            if work is None:
                break
            waiter = self._waiting.popleft()
            waiter.work, waiter.handed_at = work, time.perf_counter()
            self._take_off(waiter)
            handed += 1
        if self._waiting and self._waiting[0] is not head:
            self._wake(self._waiting[0])  # the new first waiter takes over the polling
        return handed

    def dismiss_all(self) -> None:
        """Wakes every waiter without work (the loop stops)."""
        while self._waiting:
            self._take_off(self._waiting.popleft())

    def is_first(self, waiter: Waiter[Work]) -> bool:
        return bool(self._waiting) and self._waiting[0] is waiter
