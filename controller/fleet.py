"""The rollout fleet: which replicas take part in the run, as they join and leave while it trains.

Members started with the run (`rollout.replicas`, `rollout.addresses`) are in it from the start; a
failure of one of those is waited out (controller/recovery.py: `rlfleet run` restarts it). Members
that joined (`rlfleet serve rollout --join`) leave instead: killed, drained or stopped, their
in-flight groups go back to the queue and the run goes on with the others.

A member's life: `joining` (accepted, not yet in the weight group) -> `live` (in the weight group
at the current version, takes work) -> `leaving` (finishes or hands back its groups, takes no new
work) -> out. Membership changes reach the weight group only at a version boundary: the training
side re-forms the group over `weight_members()` and pushes the current version (Recovery.resync),
then calls `commit`, which makes joiners live. So a joiner never generates before it holds the
current weights, and every later version reaches it with the others in the one broadcast.

The fleet is shared by the gRPC threads (Join, Leave), the heartbeat thread and the loop's
threads: every change happens under its lock; the loop reads snapshots.
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from rlfleet.addresses import check_address
from rlfleet.errors import Busy, FleetRefused, InvalidRequest, RlfleetError, ServiceUnavailable
from rlfleet.models.identity import difference, identity_of
from controller.clients import RolloutClient
from controller.fleet_liveness import FleetLiveness

log = structlog.get_logger(__name__)

JOINING, LIVE, LEAVING = "joining", "live", "leaving"
# A Join is checked by calling the replica back: JOIN_CHECK_S at most, on at most MAX_JOIN_CHECKS server
# threads at once (more are refused as Busy and the replica asks again). Without a token anyone may send
# Joins: 20 naming a dead port once held every thread for 30 s and health timed out (issue 32).
JOIN_CHECK_S = 10.0
MAX_JOIN_CHECKS = 4
MAX_NAME_CHARS = 64


@dataclass(eq=False)
class Member:
    name: str
    client: RolloutClient
    joined: bool  # joined while the run went on (leaves on failure) rather than started with it
    state: str = LIVE
    since: float = field(default_factory=time.time)
    groups: int = 0  # groups it generated in this run
    misses: int = 0  # heartbeats in a row it did not answer
    heard: float = 0.0  # time.monotonic() when it last showed it is alive (a group, a status answer)
    pinged: bool = False  # its channel's keepalive pings watched it at the last heartbeat (fleet_liveness)
    idle: threading.Event = field(default_factory=threading.Event)  # its generation task ended
    gone: threading.Event = field(default_factory=threading.Event)  # out of the run
    finished: int = 0  # groups it finished while leaving
    handed_back: int = 0  # groups re-queued from it while leaving
    served: bool = True  # held the run's weights and took work at some point (a leave counts)
    generating: bool = False  # the loop started its generation task
    leave_reason: str = ""  # drained, sigterm
    instance: float | None = None  # the replica process's id (its status's `instance`): a restart changes it

    @property
    def address(self) -> str:
        return self.client.address

    def takes_work(self) -> bool:
        return self.state == LIVE and not self.gone.is_set()


class Fleet(FleetLiveness):
    def __init__(self, initial: list[RolloutClient], *, architecture: dict | None = None, summary: str = "",
                 connect: Callable[[str], RolloutClient] | None = None,
                 note: Callable[..., None] = lambda event, **fields: None,
                 heartbeat_s: float = 1.0, max_misses: int = 3, heartbeat_timeout_s: float = 3.0):
        """`initial`: the replicas the run started with; `architecture`/`summary`: the run's model
        (rlfleet.models.identity), whose identity a joiner must share; `connect`: a client to a joiner's
        address (waits until it serves); `note`: the journal; a joined member that misses
        `max_misses` heartbeats in a row (`heartbeat_s` apart, each with `heartbeat_timeout_s`: a
        busy replica may answer late, a dead one is refused at once) is taken for dead."""
        self.architecture, self.summary = architecture, summary
        self.identity = identity_of(architecture) if architecture is not None else None
        self._connect = connect
        self._note = note
        self.heartbeat_s, self.max_misses = heartbeat_s, max_misses
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self._lock = threading.Lock()
        self._members: dict[str, Member] = {}
        for index, client in enumerate(initial):
            self._members[client.address] = Member("rollout" if index == 0 else f"rollout-{index}", client,
                                                   joined=False)
        self._departed: dict[str, str] = {}  # address -> why it left (a drained replica reads it and stops)
        self._checking = threading.BoundedSemaphore(MAX_JOIN_CHECKS)  # Joins being called back now
        self.joins = 0
        self.leaves = 0
        self.changes = 0  # counts changes of membership or state (GetRunStatus reuses a reply until then)
        # who the weight group holds now (members by identity); another set asks for a re-form
        self._in_group: frozenset[Member] = frozenset(self._members.values())
        self.on_live: Callable[[Member], None] = lambda member: None  # the loop starts its generation
        self.on_change: Callable[[], None] = lambda: None  # wakes the loop's waiters

    # ---- reading ------------------------------------------------------------------------------
    def members(self) -> list[Member]:
        with self._lock:
            return list(self._members.values())

    def live(self) -> list[Member]:
        return [m for m in self.members() if m.state in (LIVE, LEAVING)]

    def weight_members(self) -> list[Member]:
        """Who the next re-formed weight group takes: all but members that finished leaving."""
        return [m for m in self.members() if not (m.state == LEAVING and m.idle.is_set())]

    def reform_pending(self) -> bool:
        """Whether the weight group should be re-formed at the next version boundary: someone joined,
        left or finished leaving since the last one."""
        return frozenset(self.weight_members()) != self._in_group

    def metrics(self) -> dict[str, float]:
        return {"fleet/replicas": float(len(self.live())), "fleet/joins": float(self.joins),
                "fleet/leaves": float(self.leaves)}

    # ---- joining ------------------------------------------------------------------------------
    def join(self, address: str, name: str, identity: str, summary: str = "",
             architecture: str = "") -> Member:
        """Accepts the replica at `address` (FleetRefused: another model); it takes work once the
        next re-formed weight group gave it the current version."""
        if self._connect is None or self.identity is None:
            raise FleetRefused("this controller does not take joining replicas")
        address, name = _checked(address, name)
        if identity != self.identity:
            raise FleetRefused(f"it serves a different model than this run: {self._difference(architecture)} "
                               f"(start it with the run's model.path)")
        self._refuse_founder(address)
        if not self._checking.acquire(blocking=False):
            raise Busy(f"the controller is checking {MAX_JOIN_CHECKS} other Joins now; ask again in a moment")
        try:
            client, instance = self._call_back(address)
        finally:
            self._checking.release()
        with self._lock:
            old = self._members.get(address)
            same = old is not None and instance is not None and old.instance == instance
        if same:  # the member's own process, still answering: a repeated Join (or a spoofed one) keeps it
            client.close()
            self._note("join_repeated", replica=address, name=old.name)
            log.warning("a Join for a replica that is already a member, as the same process; it stays as it "
                        "is", replica=address, name=old.name, state=old.state)
            return old
        if old is not None:  # back after a restart the heartbeat has not noticed yet: it starts afresh
            self.remove(old, "rejoined")
        with self._lock:
            taken = {m.name for m in self._members.values()}
            if not name or name in taken:
                name = next(f"rollout-{i}" for i in range(1, 10_000) if f"rollout-{i}" not in taken)
            member = Member(name, client, joined=True, state=JOINING, served=False, instance=instance)
            self._members[address] = member
            self._departed.pop(address, None)
        self._note("join_accepted", replica=address, name=name)
        log.info("replica accepted; it gets the current weights at the next version boundary",
                 replica=address, name=name)
        self._changed()
        return member

    def _refuse_founder(self, address: str) -> None:
        """A Join naming the address of a member the run started with is refused: that replica takes part
        without a Join and, when it fails, is waited for and taken back in place (controller/recovery.py).
        Without a token anyone may send Joins, and one naming its address (which that replica answers)
        replaced it with a joined member that a Leave could then take out of the run (issue 42)."""
        with self._lock:
            old = self._members.get(address)
        if old is not None and not old.joined:
            self._note("join_refused", replica=address, name=old.name, reason="run_started")
            log.warning("a Join named a replica this run started with; refused, it stays as it is",
                        replica=address, name=old.name)
            raise FleetRefused(f"{address} is the replica {old.name!r}, which this run started with "
                               "(rollout.address / rollout.addresses): it takes part without a Join")

    def _call_back(self, address: str) -> tuple[RolloutClient, float | None]:
        """A client of the replica at `address`, which must answer within JOIN_CHECK_S, and the id of
        its process. Calls both ways carry the job's token: the replica must take the controller's too."""
        try:
            client = self._connect(address)
        except RlfleetError as exc:
            raise FleetRefused(f"the controller cannot reach it at {address} within {JOIN_CHECK_S:g}s "
                               f"({exc}); is that the address others reach it at (--advertise)?") from None
        try:
            # the answer stays with the client (RolloutClient.kept_status): while its kept-alive
            # connection stays up, no re-form asks this process its status again
            status = client.status(timeout_s=5.0)
        except RlfleetError as exc:
            client.close()
            raise FleetRefused(f"the controller cannot call it back ({exc}): does it use this job's security "
                               "settings?") from None
        return client, status.stats.get("instance")

    def _difference(self, architecture: str) -> str:
        try:
            theirs = json.loads(architecture)
        except ValueError:
            theirs = None
        if isinstance(theirs, dict) and self.architecture is not None:
            return difference(self.architecture, theirs)
        return "its architecture or tokenizer differs"

    def commit(self, synced: list[Member], version: int) -> None:
        """A re-formed group served `version` to `synced`: joiners among them go live; members that
        finished leaving and were left out are gone."""
        started = []
        with self._lock:
            self._in_group = frozenset(synced)
            for member in synced:
                if member.state == JOINING and self._members.get(member.address) is member:
                    member.state, member.since, member.served = LIVE, time.time(), True
                    self.joins += 1
                    self.changes += 1
                    started.append(member)
            finished = [m for m in self._members.values()
                        if m.state == LEAVING and m.idle.is_set() and m not in synced]
        for member in started:
            self._note("joined", replica=member.address, name=member.name, version=version)
            log.info("replica joined", replica=member.address, name=member.name, version=version,
                     replicas=len(self.live()))
            self.on_live(member)
        for member in finished:
            self.remove(member, member.leave_reason or "drained")

    def leave_out(self, member: Member, error: BaseException) -> None:
        """`member` failed a call of a re-form (controller/reform.py) and leaves the run: unreachable
        (its leave's own reason if it was leaving), or, refusing, `join_failed` for a joiner and
        `failed` for a member that worked."""
        if isinstance(error, ServiceUnavailable):
            reason = _unreachable_reason(member)
        else:
            reason = "join_failed" if member.state == JOINING else (member.leave_reason or "failed")
        self.remove(member, reason)

    def drop_joining(self, reason: str) -> None:
        """Joiners that a re-formed group could not take (their join or pull failed) are turned away,
        so they cannot hold up the members already working."""
        for member in self.members():
            if member.state == JOINING:
                self.remove(member, reason)

    # ---- leaving ------------------------------------------------------------------------------
    def find(self, address: str) -> Member:
        with self._lock:
            member = self._members.get(address)
        if member is None:
            raise FleetRefused(f"no rollout replica at {address} in this run (members: "
                               f"{', '.join(self._members) or 'none'})")
        return member

    def leave(self, address: str, timeout_s: float, reason: str = "drained") -> Member:
        """Stops giving `address` work, lets it finish its groups for `timeout_s` (then hands the rest
        back), and returns once it is out of the weight group (at the next version boundary)."""
        member = self.find(address)
        with self._lock:
            member.leave_reason = reason
            was = member.state
            if member.state in (JOINING, LIVE):
                member.state = LEAVING
        self._note("leaving", replica=address, reason=reason)
        if was == JOINING:  # never in the weight group, never worked: nothing to finish
            member.idle.set()
            self.remove(member, reason)
            return member
        self._changed()
        if not member.idle.wait(timeout_s):
            member.client.close()  # cuts its stream: the groups not yet back are re-queued
            member.idle.wait(10)
        self._changed()  # re-form without it
        if not member.gone.wait(timeout_s + 60):
            self.remove(member, reason)  # the boundary did not come: it goes anyway
        return member

    def generation_ended(self, member: Member) -> None:
        """The member's generation task ended (it left or failed)."""
        member.idle.set()
        self._changed()

    def remove(self, member: Member, reason: str) -> None:
        with self._lock:
            if self._members.get(member.address) is not member or member.gone.is_set():
                return
            del self._members[member.address]
            self._departed[member.address] = reason
            while len(self._departed) > 1000:
                del self._departed[next(iter(self._departed))]
            member.gone.set()
            self.leaves += member.served
        member.client.close()
        self._note("left", replica=member.address, name=member.name, reason=reason,
                   finished=member.finished, handed_back=member.handed_back)
        log.warning("replica left", replica=member.address, name=member.name, reason=reason,
                    replicas=len(self.live()))
        self._changed()

    def _remove_unreachable(self, member: Member) -> None:
        self.remove(member, _unreachable_reason(member))

    def _changed(self) -> None:
        self.changes += 1
        self.on_change()

    def describe(self) -> list[dict[str, Any]]:
        """The members, then those that left (state `left: <reason>`; a drained replica stops on it)."""
        with self._lock:
            departed = dict(self._departed)
        return [*({"name": m.name, "address": m.address, "state": m.state, "joined": m.joined,
                   "groups": m.groups, "since": m.since} for m in self.members()),
                *({"name": "", "address": a, "state": f"left: {why}", "joined": True, "groups": 0,
                   "since": 0.0} for a, why in departed.items())]


def _checked(address: str, name: str) -> tuple[str, str]:
    """A Join's address (host:port, port 1..65535, nothing else) and name, or InvalidRequest: nobody
    waits for an address that can never answer."""
    try:
        address = check_address(address)
    except ValueError as exc:
        raise InvalidRequest(f"Join address: {exc}") from None
    if len(name) > MAX_NAME_CHARS or any(not c.isprintable() or c.isspace() for c in name):
        raise InvalidRequest(f"Join name: at most {MAX_NAME_CHARS} characters without spaces or control "
                             f"characters, got {name[:80]!r}")
    return address, name


def _unreachable_reason(member: Member) -> str:
    """Why a member that stopped answering has left: a member that was leaving (its drain may have cut
    its channel) has left for that reason, so a drained replica reads `left: drained` and stops."""
    return (member.leave_reason or "unreachable") if member.state == LEAVING else "unreachable"
