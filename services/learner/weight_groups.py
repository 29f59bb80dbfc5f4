"""The weight groups a learner hosts, named by their rendezvous address.

Why more than one: without a token anyone who reaches the learner may call OpenWeightGroup, and when
an Open replaced the one group, a single stray call took the running job's group away (issue 32).
Now each Open adds a group and a push names the group it is for (PushWeightsRequest.group); the
group pushed to last ("active") is never closed by an Open, and a successful push to a group closes
every other one (the controller opens a new group only to replace its old one). Groups opened but
never pushed to are kept up to MAX_PENDING, the oldest closed first. A push naming no group goes to the
group opened last while it is open, never to an older one: a stray client's group closed by the run's
push left the run's own group "the one opened last", and the stray push held it (issue 42).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

from rlfleet.errors import Busy, NotReady, WeightSyncError
from rlfleet.weights import WeightGroup

MAX_PENDING = 8  # groups opened and not yet pushed to; a flood of Opens closes the oldest of them


@dataclass(eq=False)
class HostedGroup:
    group: WeightGroup
    sender: object  # WeightSender or IpcWeightSender
    backend: str

    @property
    def address(self) -> str:
        return self.group.address


class WeightGroups:
    def __init__(self, max_pending: int = MAX_PENDING) -> None:
        self.max_pending = max_pending
        self._lock = threading.Lock()
        self._opened: list[HostedGroup] = []  # oldest first; the active one among them
        self._active: HostedGroup | None = None
        self._busy: set[HostedGroup] = set()  # being pushed to now: never closed under the push
        self._newest: HostedGroup | None = None  # opened last: the group a push naming none is for

    def add(self, hosted: HostedGroup) -> None:
        with self._lock:
            self._opened.append(hosted)
            self._newest = hosted
            pending = [h for h in self._opened if h is not self._active and h not in self._busy]
            evicted = pending[:max(0, len(pending) - self.max_pending)]
            self._opened = [h for h in self._opened if h not in evicted]
        for hosted in evicted:
            hosted.group.close()

    def find(self, address: str = "") -> HostedGroup:
        """The group at `address` (empty: the one opened last, while it is open)."""
        with self._lock:
            return self._find(address)

    def _find(self, address: str) -> HostedGroup:
        if not address:
            newest = self._newest
            if newest is None:
                raise NotReady("no weight group: call OpenWeightGroup first")
            if newest not in self._opened:  # never another, older group: the run's (issue 42)
                raise WeightSyncError(f"the weight group opened last, at {newest.address}, was closed (a "
                                      "push to another group, or a failed push, closes it): open a new "
                                      "one and name it in PushWeightsRequest.group")
            return newest
        found = next((h for h in self._opened if h.address == address), None)
        if found is None:
            raise WeightSyncError(f"no weight group at {address} on this learner (closed after a "
                                  "failed push or replaced by a newer one): open a new one")
        return found

    def take(self, address: str = "") -> HostedGroup:
        """The group at `address` (empty: the one opened last), held for a push until `done`; Busy while
        another push to it runs (two pushes must not build one group's rendezvous at once)."""
        with self._lock:
            found = self._find(address)
            if found in self._busy:
                raise Busy(f"PushWeights refused: a push to the weight group at {found.address} is in "
                           "progress; retry after it ends")
            self._busy.add(found)
            return found

    def done(self, hosted: HostedGroup, outcome: str) -> None:
        """After a push to `hosted`: `pushed` makes it the active group and closes every other one;
        `failed` closes it (its ranks must rebuild on a new group); `untouched` (refused before
        anything was sent) changes nothing."""
        with self._lock:
            self._busy.discard(hosted)
            closing: list[HostedGroup] = []
            if outcome == "pushed":
                closing = [h for h in self._opened if h is not hosted and h not in self._busy]
                self._active = hosted
            elif outcome == "failed":
                closing = [hosted]
                if self._active is hosted:
                    self._active = None
            self._opened = [h for h in self._opened if h not in closing]
        for old in closing:
            old.group.close()

    def abort(self, address: str, reason: str) -> bool:
        """Ends the push to the group at `address` at once: it fails naming `reason`, and the group is
        closed as after any failed push (its ranks must rebuild on a new group). A group nobody pushes on
        is closed now, its members woken from a rendezvous no push will come to. Returns whether a push
        was on it; with no group there, nothing is done (False)."""
        with self._lock:
            found = next((h for h in self._opened if h.address == address), None)
            if found is None:
                return False
            pushing = found in self._busy
            if not pushing:  # the push, if any, closes it in done()
                self._opened.remove(found)
                if self._active is found:
                    self._active = None
        found.group.abort(reason)
        if not pushing:
            found.group.close()
        return pushing

    def latest(self) -> HostedGroup | None:
        with self._lock:
            return self._opened[-1] if self._opened else None

    def close(self) -> None:
        with self._lock:
            opened, self._opened, self._active, self._newest = self._opened, [], None, None
        for hosted in opened:
            hosted.group.close()
