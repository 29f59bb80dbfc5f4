"""The training side's batch, of GRPOLoop (controller/loop.py): B fresh groups taken from the buffer of
scored groups (oldest version first), stale, unusable and filtered ones dropped and their admission slots
given back; a batch whose payloads the learner could not fetch is taken again; the stall watchdog's facts.
State lives on the loop.
"""
from __future__ import annotations

import heapq
import time
from collections import Counter

import structlog

from rlfleet.errors import RlfleetError
from controller.groups import ScoredGroup
from controller.recovery import Stopped
from controller.sample_lines import sample_record
from controller.stall import StallFacts
from controller.state import Dispatch

log = structlog.get_logger(__name__)


class BatchSide:
    """Mixed into GRPOLoop: waits for a step's groups in its buffer."""

    def _take_batch(self, train_version: int) -> tuple[list[ScoredGroup], Counter[str]]:
        """Waits for B fresh groups; stale ones, and (dynamic sampling) groups whose rewards are all
        equal, are dropped and their admission slots given back, so generation makes up for them.
        Returns the batch and how many groups were dropped, by reason (stale, unusable, filtered)."""
        batch: list[ScoredGroup] = []
        dropped: Counter[str] = Counter()
        filter_limit = self.samples.filter_limit(self.B)
        # The outage and stall checks (a dozen calls, a median over the step times) run as the loop
        # looks at the buffer afresh (on entry, after each wait) and before it waits, not once per
        # buffered group (issue 44): a drain takes microseconds under the lock, and what they watch
        # (an outage, a stall) is caught at the next look, before the loop waits.
        look = True
        with self._cond:
            while len(batch) < self.B:
                if self._error is not None:
                    raise self._error
                if self.stop.is_set():
                    raise Stopped("stopping")
                if look or not self._buffer:
                    look = False
                    self._check_outages_and_stall()
                if not self._buffer:
                    look = True  # each way out of this branch waits or unlocks
                    self._check_fleet_not_empty()
                    # a replica came back, joined or left: rebuild the group now, unlocked
                    if self.recovery.resync_pending() or self.fleet.reform_pending():
                        self._cond.release()
                        began = time.monotonic()
                        try:
                            self.recovery.service_pending(train_version)
                        finally:
                            self._cond.acquire()
                            self.stall.waited_on("weight-group re-forms and pushes", time.monotonic() - began)
                        continue
                    self._cond.wait(0.5)
                    continue
                _, _, group = heapq.heappop(self._buffer)
                usable = len(group.scored()) >= 2
                if not (self.gate.is_fresh(group.version, train_version) and usable):
                    self._drop(group, "unusable" if usable is False else "stale", train_version, dropped)
                elif not self.samples.keep(group):
                    self._drop(group, "filtered", train_version, dropped)
                    if filter_limit is not None and dropped["filtered"] > filter_limit:
                        raise RlfleetError(f"dynamic sampling dropped {dropped['filtered']} groups with "
                                           "equal rewards in one step; the task is solved or unsolvable "
                                           "for this policy (raise algorithm.max_gen_batches, 0 never "
                                           "gives up)")
                else:
                    batch.append(group)
                    continue
                self._admitted -= 1
                self._wake()
        return batch, dropped

    def _check_outages_and_stall(self) -> None:
        """Raises an expired environment outage, or RunStalled once no step trained for the stall
        limit (whose clock stops while the loop waits out something bounded elsewhere)."""
        expired = self.env_outage.expired() if self.env_outage is not None else None
        if expired is not None:
            raise expired
        if self._bounded_elsewhere():
            self.stall.hold()
        else:
            stalled = self.stall.expired(self._stall_facts)
            if stalled is not None:
                raise stalled

    def _retake_batch(self, groups: list[ScoredGroup], lost: list[ScoredGroup], version: int,
                      exc: BaseException) -> tuple[list[ScoredGroup], Counter[str]]:
        """The learner could not fetch `lost`'s payloads: their prompts are re-queued (generated again,
        with their request's seed), the batch's other groups go back to the buffer, and a batch is taken
        again."""
        log.warning("data plane: a step's payloads are gone; re-queueing their prompts", groups=len(lost),
                    error=str(exc)[:300])
        with self._cond:
            for g in lost:
                self._note("requeued", seq=g.seq, reason="payload_lost", replica=g.replica)
                dispatch = self._live.get(g.seq)
                self._requeue.appendleft(Dispatch(dispatch.seed if dispatch else None, [(g.seq, g.prompt)]))
            gone = {g.seq for g in lost}
            for g in groups:
                if g.seq not in gone:
                    heapq.heappush(self._buffer, (g.version, g.seq, g))
            self._wake()
        return self._take_batch(version)

    def _drop(self, group: ScoredGroup, reason: str, train_version: int, dropped: Counter[str]) -> None:
        dropped[reason] += 1
        self._dropped_since_step[reason] += 1
        self._dropped_samples += len(group.completions)
        self._live.pop(group.seq, None)
        self._note("dropped", seq=group.seq, reason=reason, version=group.version,
                   train_version=train_version)
        self._keep_failed_episodes(group, reason)
        if self.releaser is not None:
            self.releaser.release(group)

    def _keep_failed_episodes(self, group: ScoredGroup, reason: str) -> None:
        """The failed episodes of a dropped group go to samples/train.jsonl at once, with their error and
        `dropped` (a run whose environment fails everything shows why, even if it never trains a step);
        at most controller.samples_per_step a step, and at most SampleQuota's rate (64 a minute) however
        many are dropped (a run that trains no step would otherwise write every one)."""
        limit = self.cfg.controller.samples_per_step
        failed = [(c, r) for c, r in zip(group.completions, group.results) if c.failed]
        if limit is not None:
            failed = failed[:max(0, limit - self._failed_kept)]
        failed = failed[:self._dropped_quota.take(len(failed))] if failed else failed
        self._failed_kept += len(failed)
        records = [{**sample_record(self.step + 1, None, group, c, r), "dropped": reason}
                   for c, r in failed]
        if records:
            self.writer.log_samples(records)

    def _bounded_elsewhere(self) -> bool:
        """Whether the loop waits out something with a bound of its own, which the stall limit leaves
        to it: a reward or environment outage (its max_outage_s), a replica down or an empty fleet
        (controller.service_wait_s), the weight resync of a replica that came back
        (learner.weight_sync_timeout_s)."""
        return (self.recovery.reward_outage.blocked()
                or (self.env_outage is not None and self.env_outage.status()[0] != "running")
                or bool(self.recovery.waiting) or not self.fleet.members()
                or self.recovery.resync_pending())

    def _stall_facts(self) -> StallFacts:
        """What the loop saw since its last step, for the stall line (called with the lock held)."""
        failed_episodes = Counter(self._env_failed)
        last_error = self.env_failures.last_error if self.env_failures is not None else ""
        note = ""
        if self.cfg.env.kind == "openenv" and "CAPACITY_REACHED" in last_error:  # it names N/N sessions
            note = (f"each episode holds a session of the OpenEnv server: a group needs rollout.n="
                    f"{self.cfg.rollout.n} sessions at once")
        paused = ("a replica's weight resync" if self.recovery.resync_pending() else "")
        return StallFacts(dropped=Counter(self._dropped_since_step), dropped_samples=self._dropped_samples,
                          env_failed=failed_episodes, env_last_error=last_error,
                          env_note=note, reward_failed_items=self._failed["items"],
                          replicas=len(self.fleet.live()), in_flight=len(self._live),
                          buffered=len(self._buffer), paused=paused)
