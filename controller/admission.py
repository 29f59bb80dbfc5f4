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
        self.joined_t = time.time()
        self.handed_at = 0.0  # time.perf_counter() when the work was handed to it
        self.handed_t: float | None = None  # the same, wall clock (the journal's)
        # Wall clock since when admission had given nothing, set once the member is refused work: the
        # gate then held its slot from then (or from when the slot was freed, if later), not only from
        # when the controller saw the slot free (a group received late while the gate was closed
        # delayed nothing: bench/fleetsim/measure.py controller_admission). None: never refused.
        self.held_since: float | None = None
        self.queued = True  # in the queue (taken off when handed work or woken without)

    def held_s(self) -> float:
        """Seconds it waited for admission: from asking until its work was handed out (not until its
        task woke up to take it, which is the controller's own latency)."""
        return self.handed_at - self.joined_at

    def hold_fields(self) -> dict[str, float]:
        """Its hold, for its `dispatched` journal lines: `held_s`, and for a member refused work, since
        when admission had given nothing (`held_since`) and when its work came (`handed_t`), wall clock
        (bench/fleetsim/measure.py controller_admission takes the gate's hold of the free slot out)."""
        fields = {"held_s": round(self.held_s(), 4)}
        if self.held_since is not None and self.handed_t is not None:
            fields.update(held_since=round(self.held_since, 4), handed_t=round(self.handed_t, 4))
        return fields


class AdmissionQueue(Generic[Work]):
    """The members waiting for work, first come first served. `wake(waiters)`: wakes those members,
    from any thread; called once per hand-out with all it woke (one call into the event loop for a
    burst of N, not N)."""

    def __init__(self, wake: Callable[[list[Waiter[Work]]], None]) -> None:
        self._wake_all = wake
        self._waiting: deque[Waiter[Work]] = deque()
        self._to_wake: list[Waiter[Work]] = []
        self.wakeups = 0  # times a waiting member was woken (a herd would show here)
        self._last_handed_t: float | None = None  # wall clock of the last hand-out that gave work

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
                self._refused()
                break
            waiter = self._waiting.popleft()
            waiter.work, waiter.handed_at, waiter.handed_t = work, time.perf_counter(), time.time()
            self._last_handed_t = waiter.handed_t
            self._take_off(waiter)
            handed += 1
        if self._waiting and self._waiting[0] is not head:
            self._to_wake.append(self._waiting[0])  # the new first waiter takes over the polling
        self._flush()
        return handed

    def _refused(self) -> None:
        """Admission gave no work to the waiters: those refused for the first time (the newest, at the
        back) are held since the last hand-out. Admission gave nothing between it and now: a member
        that waits was refused at its join (every join is followed by a hand-out), and work that came
        meanwhile would have gone to it then. Never later than its join: waiting behind members that
        got work after it asked is the gate's hold too. Amortised O(1): each waiter is marked once."""
        last = self._last_handed_t
        for waiter in reversed(self._waiting):
            if waiter.held_since is not None:
                break
            waiter.held_since = waiter.joined_t if last is None else min(last, waiter.joined_t)

    def dismiss_all(self) -> None:
        """Wakes every waiter without work (the loop stops)."""
        while self._waiting:
            self._take_off(self._waiting.popleft())
        self._flush()

    def is_first(self, waiter: Waiter[Work]) -> bool:
        return bool(self._waiting) and self._waiting[0] is waiter
