"""Noticing the dead members of the rollout fleet, of Fleet (controller/fleet.py): the heartbeat asks the
joined members nothing else watches (their channel's keepalive pings, a word heard lately) for their
status, all at once, and removes those that miss `max_misses` answers in a row; after a failed re-form,
the members that do not answer are left out. State lives on the fleet.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import structlog

from rlfleet.errors import RlfleetError
from controller.clients import watched_alive

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
        channel pings it (_pinged), or it was heard from (a group, a stream that ended) within the last
        `heartbeat_s`. A status call per member per second cost a 256-replica controller a quarter of its
        CPU (issues 34, 44). Those asked are asked at once (HEARTBEAT_CALLS at a time); one that missed
        `max_misses` in a row is removed (its stream is cut, so its groups are re-queued).

        A member whose pings watched it at an earlier beat and no longer do (its connection was lost:
        pings unanswered for KEEPALIVE_TIMEOUT_S, or closed) has been silent for a while already: its
        next status call decides (one miss removes it; an answer clears it). So a frozen or partitioned
        idle member is out within KEEPALIVE_S + KEEPALIVE_TIMEOUT_S + heartbeat_s + heartbeat_timeout_s
        (8 + 1 + 3 = 12 s by default), as within max_misses × (heartbeat_s + heartbeat_timeout_s) when
        every beat asked it; a killed one at the next beat. Returns those removed."""
        now = time.monotonic()
        asked = []
        for member in self.members():
            if not member.joined or member.gone.is_set():
                continue
            if _pinged(member):
                member.pinged = True
                continue
            if now - max(member.heard, member.client.answered) < self.heartbeat_s:
                continue
            if member.pinged:
                member.pinged = False
                member.misses = max(member.misses, self.max_misses - 1)
            asked.append(member)
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


def _pinged(member: Member) -> bool:
    """Whether the member's channel pings it (controller/clients.py watched_alive): a Generate stream
    open on it (a frozen or partitioned replica fails it, and its generation task removes it), or, with
    no stream open (at S = 1 most members wait in the admission queue), its connection still READY."""
    return watched_alive(member.client)


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
