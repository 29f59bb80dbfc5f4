"""What the loop does when a service fails: wait (bounded), retry, re-queue, rebuild the weight group.

* rollout call fails: the prompts of that request not yet returned are re-queued (journal:
  `requeued`, reason `rollout_failed`) and go to the next free replica; this replica's thread
  waits until it answers again, then asks for the weight group to be rebuilt (a restarted
  replica serves its initial weights) and for the current version to be pushed to it.
* reward call fails (ServiceUnavailable: the reward service, or every way to a reward, is down):
  a reward outage (controller/reward_outage.py): admission pauses, the group being scored waits
  and is scored again, with backoff, until a call succeeds; after `reward.max_outage_s` the run
  stops with the cause. Any other reward error stops the run at once.
* learner call fails: waits until the learner is back (restarted from its newest checkpoint by
  `rlfleet run`); if that checkpoint is one step behind, the last batch is replayed; then the
  weight group is rebuilt and the call retried.
* Train fails (deadline passed, connection lost): retried, which is safe because the batch carries
  its step and expected version and the learner answers a repeat with the stored result. First
  the learner must be idle (a step that outlived the caller's deadline finishes), then: at the
  version after the step, the retry fetches the result; at or behind the step's version, the
  learner restarted and is repaired as above before the retry.
* weight push fails (a receiver died or stalled; the group's timeout aborts it): the group is
  rebuilt and the version pushed again; rollouts serve the last complete version meanwhile.

Every other wait ends after `controller.service_wait_s` with an error naming the service.
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import structlog

from rlfleet.errors import Busy, RlfleetError, ServiceUnavailable, WeightSyncError
from rlfleet.types import ScoreItem, ScoreResult, TrainBatch, TrainResult
from controller.reform import MembersFailed, next_group
from controller.reward_outage import RewardOutage

# The wait before asking a service that failed again: RETRY_FIRST_S, doubled after every failure up to
# RETRY_MAX_S (one policy for the reward, a replica, the learner and the weight group).
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 5.0

if TYPE_CHECKING:
    from controller.clients import LearnerClient, RewardClient, RolloutClient
    from controller.fleet import Fleet, Member
    from controller.state import Dispatch
    from controller.weight_sync import WeightSync

log = structlog.get_logger(__name__)
T = TypeVar("T")
# Busy: the learner runs another weight operation (a push someone else asked for): it ends, then ours runs.
_RETRYABLE = (ServiceUnavailable, WeightSyncError, Busy)


class Stopped(RlfleetError):
    """The loop was asked to stop."""


class RecoveringLoop(Protocol):
    """What Recovery reads and changes of the loop it repairs (controller.loop.GRPOLoop): declared here
    so that recovery does not import the loop that imports it."""

    reward: RewardClient
    learner: LearnerClient
    sync: WeightSync
    fleet: Fleet
    stop: threading.Event
    _cond: threading.Condition
    _requeue: deque[Dispatch]
    _rollout_version: int
    checkpointed_step: int  # the newest step with a checkpoint (0: none)

    def _note(self, event: str, **fields: Any) -> None: ...

    def _wake(self) -> None: ...  # admission may have changed: work is handed out, waiters re-check


class Recovery:
    def __init__(self, loop: RecoveringLoop, wait_s: float, max_outage_s: float = 300.0):
        self.loop = loop
        self.wait_s = wait_s
        self.reward_outage = RewardOutage(max_outage_s, on_change=lambda state, fields: loop._note(
            "reward_outage" if state == "outage" else "reward_back", **fields))
        self._resync = threading.Event()  # a replica came back and needs the group and the weights
        self.generation = 0  # weight-group rebuilds so far
        self.last_batch: TrainBatch | None = None
        self.events: list[dict[str, Any]] = []
        self.waiting: set[str] = set()  # replicas waited for now (controller.service_wait_s bounds it)

    def _deadline(self) -> float:
        return time.monotonic() + self.wait_s

    def _expired(self, deadline: float, what: str, exc: BaseException) -> None:
        if time.monotonic() > deadline:
            raise ServiceUnavailable(f"{what} did not recover within controller.service_wait_s="
                                     f"{self.wait_s:g}s: {exc}") from None

    def _sleep(self, delay: float) -> float:
        if self.loop.stop.wait(delay):
            raise Stopped("stopping")
        return min(delay * 2, RETRY_MAX_S)

    def _event(self, kind: str, **fields: Any) -> None:
        self.events.append({"event": kind, **fields})
        self.loop._note(kind, **fields)
        log.warning("recovery", recovery=kind, **fields)

    # ---- reward -------------------------------------------------------------------------------
    def score(self, items: list[ScoreItem]) -> list[ScoreResult]:
        """The group's rewards; waits out a reward outage (RewardOutageExpired after
        reward.max_outage_s), Stopped when the loop stops meanwhile."""
        delay = RETRY_FIRST_S
        while True:
            try:
                results = self.loop.reward.score(items)
            except ServiceUnavailable as exc:
                self._reward_failed(exc)
                delay = self._sleep(delay)
                continue
            self.reward_outage.recovered()
            return results

    async def score_async(self, items: list[ScoreItem]) -> list[ScoreResult]:
        """score() on the event loop (RewardClient.score_async, controller/scoring.py): the same
        outage handling, its waits the loop's own sleeps, so that an outage never blocks the loop
        (a stop cancels the sleeping task)."""
        delay = RETRY_FIRST_S
        while True:
            try:
                results = await self.loop.reward.score_async(items)
            except ServiceUnavailable as exc:
                self._reward_failed(exc)
                await asyncio.sleep(delay)
                if self.loop.stop.is_set():
                    raise Stopped("stopping") from None
                delay = min(delay * 2, RETRY_MAX_S)
                continue
            self.reward_outage.recovered()
            return results

    def _reward_failed(self, exc: ServiceUnavailable) -> None:
        """A Score call found no reward: the outage goes on (RewardOutageExpired once too long)."""
        if self.loop.stop.is_set():  # the channel closed under a clean exit: nothing failed
            raise Stopped("stopping") from None
        self.reward_outage.failed(exc)

    # ---- rollout ------------------------------------------------------------------------------
    def requeue(self, rollout: RolloutClient, dispatch: Dispatch, pending: dict[str, tuple[int, Any]],
                reason: str, exc: BaseException) -> int:
        """The prompts of `dispatch` whose groups did not come back go first to the next free replica
        (the ones that came back are not generated again); returns how many."""
        loop = self.loop
        left = [(seq, prompt) for seq, prompt in dispatch.members
                if any(s == seq for s, _ in pending.values())]
        # Journalled before the prompts become visible to the other generation tasks: the journal
        # must show a requeue before the dispatch to another replica that follows it.
        for seq, _ in left:
            loop._note("requeued", seq=seq, reason=reason, replica=rollout.address)
        with loop._cond:
            if left:
                dispatch.members = left
                loop._requeue.appendleft(dispatch)
            loop._wake()
        self._event("rollout_failed", replica=rollout.address, requeued=len(left), error=str(exc)[:200])
        return len(left)

    def rollout_failed(self, rollout: RolloutClient, dispatch: Dispatch,
                       pending: dict[str, tuple[int, Any]], exc: BaseException,
                       gone: Callable[[], bool] = lambda: False) -> bool:
        """A replica the run started with failed: its groups are re-queued, then it is waited for
        (`rlfleet run` restarts it) and taken back into the weight group. Returns False, at once, if
        meanwhile it left the fleet (`gone`: restarted, it rejoined at its address as a new member,
        whose own thread takes the work): the caller's thread then ends."""
        loop = self.loop
        self.requeue(rollout, dispatch, pending, "rollout_failed", exc)
        deadline, delay = self._deadline(), RETRY_FIRST_S
        self.waiting.add(rollout.address)
        try:
            while True:
                if gone():
                    return False
                try:
                    if rollout.status().ready:
                        break
                except RlfleetError as err:
                    if gone():
                        return False
                    self._expired(deadline, f"rollout replica {rollout.address}", err)
                delay = self._sleep(delay)
        finally:
            self.waiting.discard(rollout.address)
        # A restarted replica left the weight group and serves its initial weights.
        generation = self.generation
        self._resync.set()
        with loop._cond:
            loop._wake()
            while self.generation == generation:
                if loop.stop.is_set():
                    return True
                loop._cond.wait(0.5)
        return True

    def resync_pending(self) -> bool:
        return self._resync.is_set()

    # ---- weight group -------------------------------------------------------------------------
    def resync(self, version: int) -> float:
        """Rebuilds the weight group over the fleet's members and pushes `version` to every replica;
        joiners go live once they hold it (controller/fleet.py).

        A member that fails during it (dead, unreachable or refusing, at its status, its join or its
        pull) is left out and the re-form starts again over the others at once, ranks handed out
        afresh (controller/reform.py): a joined member leaves the run, its groups re-queued as for
        any leave; one the run started with is waited for. Only failures that name no member count
        as tries: after two the joiners, the group's newcomers, are turned away (`join_failed`) so
        that they cannot hold up the members."""
        loop = self.loop
        deadline, delay = self._deadline(), RETRY_FIRST_S
        began = time.monotonic()
        attempts = tries = 0
        loop.sync.forget()
        while True:
            tries += 1
            members = loop.fleet.weight_members()
            loop.sync.rollouts = [m.client for m in members]
            try:
                self._check_learner_version(version)
                seconds = 0.0
                if members:  # an empty fleet waits for a joiner; the group is formed with it
                    loop.sync.open()
                    seconds = loop.sync.sync(version)
                break
            except MembersFailed as exc:
                if self._leave_out(members, exc, version):
                    continue
                error: RlfleetError = exc  # one the run started with: waited for, as any restart
            except _RETRYABLE as exc:
                if "differ from the learner" in str(exc):
                    raise
                # a member that died meanwhile without failing a call of ours (frozen, or its pull
                # not back yet) is found here
                silent = loop.fleet.prune()
                if not silent and not isinstance(exc, Busy):
                    attempts += 1
                if attempts >= 2:  # a joiner the group cannot take must not hold up the others
                    loop.fleet.drop_joining("join_failed")
                error = exc
            self._expired(deadline, "the weight group", error)
            self._event("weight_group_retry", version=version, error=str(error)[:200])
            delay = self._sleep(delay)
        with loop._cond:
            loop._rollout_version = version
            self.generation += 1
            self._resync.clear()
            loop._wake()
        self._event("weight_group_rebuilt", version=version, generation=self.generation,
                    replicas=len(members), seconds=round(time.monotonic() - began, 3), tries=tries,
                    push_s=round(seconds, 3))
        loop.fleet.commit(members, version)
        return seconds

    def _leave_out(self, members: list[Member], exc: MembersFailed, version: int) -> bool:
        """Members that failed a re-form's call: the joined ones leave the run. Returns whether the
        re-form can go on at once (someone left and nobody the run started with is among them)."""
        by_client = {id(m.client): m for m in members}
        failed = {by_client[id(c)]: e for c, e in exc.failures.items() if id(c) in by_client}
        plan = next_group(members, failed, joined=lambda m: m.joined)
        for member in plan.leaving:
            self.loop.fleet.leave_out(member, failed[member])
        self._event("weight_group_left_out", version=version, stage=exc.stage,
                    replicas=[m.address for m in plan.leaving], waited=[m.address for m in plan.waited],
                    error=str(exc)[:200])
        return bool(plan.leaving) and not plan.waited

    def sync(self, version: int) -> float:
        """One push of `version`; a failed one is aborted (group timeout), rebuilt and pushed again."""
        if self._resync.is_set() or self.loop.fleet.reform_pending():  # a restart, a join or a leave
            return self.resync(version)
        try:
            return self.loop.sync.sync(version)
        except _RETRYABLE as exc:
            if "differ from the learner" in str(exc):
                raise
            self._event("weight_sync_failed", version=version, error=str(exc)[:200])
            return self.resync(version)

    def service_pending(self, version: int) -> None:
        """Called by the training side while it waits for groups: serves a replica's resync request."""
        if self._resync.is_set() or self.loop.fleet.reform_pending():
            self.resync(version)

    # ---- learner ------------------------------------------------------------------------------
    def _check_learner_version(self, version: int) -> None:
        """The learner must hold `version`; one step behind (it died between a step and that
        step's checkpoint) is repaired by replaying the last batch."""
        status = self.loop.learner.status()
        if not status.ready:
            raise ServiceUnavailable(f"learner at {self.loop.learner.address} is still loading")
        self.loop.payload_sink = status.payload_sink  # data_plane=flight: a restarted learner's new one
        have = status.policy_version
        if have == version:
            return
        batch = self.last_batch
        if batch is not None and have == batch.expected_version and version == have + 1:
            self.loop.learner.train(batch)
            self._event("learner_replayed", step=batch.step, version=version)
            return
        last = self.loop.checkpointed_step  # suggest a resume only where there is something to resume
        hint = (f"resume the run with controller.resume=latest (continues from step {last})" if last else
                "this run has no checkpoint to resume from")
        raise RlfleetError(f"learner at {self.loop.learner.address} restarted at policy version {have}, the "
                           f"controller is at {version}: {hint} (learner.checkpoint_every=1 lets a run "
                           "survive learner restarts in place)")

    def train(self, batch: TrainBatch) -> TrainResult:
        """One Train call, retried while the learner is unreachable (see the module docstring)."""
        learner = self.loop.learner
        if batch.expected_version < 0:  # nothing identifies the step: a retry could train it twice
            return learner.train(batch)
        deadline, delay = self._deadline(), RETRY_FIRST_S
        while True:
            try:
                return learner.train(batch)
            except Busy as exc:  # refused before it ran: asked again once the other operation ends
                self._expired(deadline, "the learner", exc)
                delay = self._sleep(delay)
                continue
            except ServiceUnavailable as exc:
                self._expired(deadline, "the learner", exc)
                self._event("learner_failed", version=batch.expected_version, step=batch.step,
                            error=str(exc)[:200])
            while True:  # until it answers and runs nothing (a timed-out step may still be running)
                try:
                    status = learner.status()
                    if status.ready and status.in_flight <= 0:
                        break
                except RlfleetError as err:
                    self._expired(deadline, "the learner", err)
                delay = self._sleep(delay)
            if status.policy_version != batch.expected_version + 1:  # it restarted: not the step's result
                self.resync(batch.expected_version)

    def call_learner(self, fn: Callable[[], T], version: int) -> T:
        """A learner call; if the learner is down, waits for it, rebuilds the group, retries."""
        deadline, delay = self._deadline(), RETRY_FIRST_S
        while True:
            try:
                return fn()
            except Busy as exc:  # refused before it ran: asked again once the other operation ends
                self._expired(deadline, "the learner", exc)
                delay = self._sleep(delay)
                continue
            except ServiceUnavailable as exc:
                self._expired(deadline, "the learner", exc)
                self._event("learner_failed", version=version, error=str(exc)[:200])
                while True:
                    try:
                        status = self.loop.learner.status()
                        if status.ready:
                            break
                    except RlfleetError as err:
                        self._expired(deadline, "the learner", err)
                    delay = self._sleep(delay)
                self.resync(version)
