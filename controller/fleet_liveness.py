"""Noticing the dead members of the rollout fleet, of Fleet (controller/fleet.py): the heartbeat asks the
joined members nothing else watches for their status, a few at a time, and removes those that miss
`max_misses` answers in a row; after a failed re-form, the members that do not answer are left out.
State lives on the fleet.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import structlog

from rlfleet.errors import RlfleetError

if TYPE_CHECKING:
    from controller.fleet import Member

log = structlog.get_logger(__name__)

PRUNE_CALLS = 64  # status calls in flight at once when a failed re-form looks for the dead
HEARTBEAT_CALLS = 16  # status calls in flight at once in a heartbeat (the members not watched otherwise)


class FleetLiveness:
    """Mixed into Fleet: its heartbeat and the re-form's prune."""

    @staticmethod
    def heard_from(member: Member) -> None:
        """`member` just showed it is alive (its stream delivered a group): the next heartbeat skips it."""
        member.heard, member.misses = time.monotonic(), 0

    def check(self) -> list[Member]:
        """One heartbeat: a joined member is asked for its status unless it is watched otherwise: its
        Generate stream is open on a channel that pings it (RolloutClient `keepalive`: a frozen or
        partitioned replica fails that stream within rlfleet.rpc.channel's KEEPALIVE_S +
        KEEPALIVE_TIMEOUT_S, and its generation task removes it), or it was heard from (a group, a
        stream that ended) within the last `heartbeat_s`. A status call per member per second cost a
        256-replica controller a quarter of its CPU (issues 34, 44). Those asked are asked at once
        (HEARTBEAT_CALLS at a time); one that missed `max_misses` in a row is removed (its stream is
        cut, so its groups are re-queued). Returns those removed."""
        now = time.monotonic()
        asked = [m for m in self.members()
                 if m.joined and not m.gone.is_set() and not self._watched(m, now)]
        dead = []
        for member, ok in zip(asked, _answering(asked, self.heartbeat_timeout_s, HEARTBEAT_CALLS)):
            if ok:
                self.heard_from(member)
                continue
            member.misses += 1
            if member.misses >= self.max_misses:
                dead.append(member)
        for member in dead:
            self._remove_unreachable(member)
        return dead

    def _watched(self, member: Member, now: float) -> bool:
        client = member.client
        if client.keepalive and client.streams > 0:
            return True
        return now - max(member.heard, client.answered) < self.heartbeat_s

    def prune(self, timeout_s: float = 2.0) -> list[Member]:
        """After a failed re-form: the members that do not answer within `timeout_s` (asked all at
        once, so a frozen one costs the re-form `timeout_s`, not `timeout_s` each); the joined ones
        among them are out."""
        members = self.members()
        silent = [m for m, ok in zip(members, _answering(members, timeout_s, PRUNE_CALLS)) if not ok]
        for member in silent:
            if member.joined:
                self._remove_unreachable(member)
        return silent

    def watch(self, stop: threading.Event) -> threading.Thread:
        def beat() -> None:
            while not stop.wait(self.heartbeat_s):
                try:
                    self.check()
                except Exception:  # noqa: BLE001 - the heartbeat must outlive one bad round
                    log.exception("fleet heartbeat failed")
        thread = threading.Thread(target=beat, name="fleet-heartbeat", daemon=True)
        thread.start()
        return thread


def _answering(members: list[Member], timeout_s: float, calls: int) -> list[bool]:
    """Whether each member answers a status call within `timeout_s`, `calls` of them asked at a time."""
    def answers(member: Member) -> bool:
        try:
            member.client.status(timeout_s=timeout_s)
            return True
        except RlfleetError:
            return False
    if len(members) <= 1:
        return [answers(m) for m in members]
    with ThreadPoolExecutor(min(calls, len(members)), thread_name_prefix="status-check") as pool:
        return list(pool.map(answers, members))
