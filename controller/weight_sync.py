"""Drives one weight transaction: the learner pushes while every rollout pulls."""
from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import Any

import structlog

from rlfleet.errors import Busy, RlfleetError, VersionMismatch, WeightSyncError
from controller.clients import LearnerClient, RolloutClient
from controller.reform import MembersFailed, member_failed, seats

log = structlog.get_logger(__name__)

MAX_REPLICAS = 256  # rollout replicas a weight group can hold
# Rollout calls of a re-form (status, JoinWeightGroup) in flight at once: a re-form costs a few
# members' round trips, not one per member (issue 34: 256 of them one after another took long enough
# for a member to die during the walk, which failed the whole re-form).
PARALLEL_CALLS = 64
# A push refused Busy is asked again after BUSY_RETRY_FIRST_S, doubling to BUSY_RETRY_MAX_S.
BUSY_RETRY_FIRST_S, BUSY_RETRY_MAX_S = 0.2, 2.0
STATUS_TIMEOUT_S = 10.0  # a member that does not answer its status within this is left out (as before)


class WeightSync:
    def __init__(self, learner: LearnerClient, rollouts: list[RolloutClient], timeout_s: float,
                 verify: bool = False):
        self.learner = learner
        self.rollouts = rollouts
        self.timeout_s = timeout_s
        self.verify = verify  # compare weight digests after every sync (one extra pass over the weights)
        # One thread per member of the largest fleet (threads start only as needed): a pull queued
        # behind another would leave the push waiting for a receiver that never comes.
        self._pool = ThreadPoolExecutor(max_workers=1 + MAX_REPLICAS, thread_name_prefix="weight-sync")
        self._calls = ThreadPoolExecutor(max_workers=PARALLEL_CALLS, thread_name_prefix="weight-reform")
        self._leftover: list[Future] = []  # calls of a failed sync still running
        # the statuses asked during the re-form in progress: a try after one that left members out
        # asks only those it has not heard from (forget() at the start of a re-form); members whose
        # status their client kept (RolloutClient.kept_status) are not asked at all
        self._statuses: dict[RolloutClient, Any] = {}
        self.group = ""  # the group open() formed, by address: pushes name it (the learner may host others)

    def forget(self) -> None:
        """A new re-form begins: every member whose status its client does not keep is asked again."""
        self._statuses.clear()

    def _ask_each(self, call: Callable[[int, RolloutClient], Any], stage: str,
                  rollouts: list[RolloutClient] | None = None) -> list[Any]:
        """`call(i, rollout)` for every rollout (default: all) at once (PARALLEL_CALLS in flight at
        most); their results in order. MembersFailed names those that failed themselves (dead,
        unreachable, refusing); otherwise the first passing failure (Busy, a broken group) is raised."""
        rollouts = self.rollouts if rollouts is None else rollouts
        futures = [self._calls.submit(call, i, r) for i, r in enumerate(rollouts)]
        results, failed, passing = [], {}, None
        for rollout, future in zip(rollouts, futures):
            try:
                results.append(future.result())
            except RlfleetError as exc:
                results.append(None)
                if member_failed(exc):
                    failed[rollout] = exc
                elif passing is None:
                    passing = exc
        if failed:
            raise MembersFailed(stage, failed)
        if passing is not None:
            raise passing
        return results

    def open(self) -> str:
        """Opens the learner's group and has every rollout join it; returns the rendezvous address.

        Every rollout is asked at once. MembersFailed names the members that failed, before ranks
        were handed out (status) or after (JoinWeightGroup): torch.distributed builds a group only
        when every rank of its world size arrives, so the caller leaves them out and opens again
        (asking for the status only those it has not heard from in this re-form).

        A member whose client kept its status (RolloutClient.kept_status: the same process, its
        kept-alive connection up since it answered) is not asked: at 256 replicas under churn a status
        call to every member at every re-form was ~4 % of the controller's GIL samples (issue 44). The
        others are asked (a replica the run started with, a lost connection), which also leaves out the
        dead before ranks are handed out; one that died unseen fails its JoinWeightGroup instead."""
        def status(i: int, rollout: RolloutClient) -> Any:
            self._statuses[rollout] = rollout.status(timeout_s=STATUS_TIMEOUT_S)  # kept if others fail
        # kept statuses are looked at again at each try of a re-form: a connection lost meanwhile is asked
        known = {r: self._statuses[r] if r in self._statuses else r.kept_status() for r in self.rollouts}
        self._ask_each(status, "status", [r for r, s in known.items() if s is None])
        statuses = [self._statuses[r] if s is None else s for r, s in known.items()]
        # A replica takes one rank per tensor-parallel worker; the learner is rank 0.
        world_size, firsts = seats([int(s.stats.get("weight_ranks", 1)) for s in statuses])
        # Each replica's placement lets the learner pick the transport (CUDA IPC on its own GPU);
        # one unknown placement leaves the choice to the learner's host alone.
        placements = [s.placement for s in statuses]
        self._settle()
        address, backend = self.learner.open_weight_group(
            world_size, self.timeout_s, placements if all(placements) else None)
        self._ask_each(lambda i, r: r.join_weight_group(address, firsts[i], world_size, backend,
                                                         self.timeout_s), "join")
        self.group = address
        log.info("weight group opened", address=address, backend=backend, members=world_size,
                 replicas=len(self.rollouts))
        return address

    def _settle(self) -> None:
        """Waits for the calls a failed sync left running: until they end a push is refused as Busy and
        a rollout's JoinWeightGroup waits for its pull. After a failed pull the push was aborted
        (_abort), and they end at once; otherwise (or a learner that did not answer the abort) within
        the group's timeout."""
        if self._leftover:
            wait(self._leftover, timeout=self.timeout_s + 10)
            self._leftover = []

    def sync(self, version: int) -> float:
        """Pushes `version` to every rollout; returns the seconds until all of them serve it. With no
        rollout (the last one left: the group was re-formed over nobody) nothing is pushed: the learner's
        previous group has no receiver left, and a push there waited out the group's timeout (issue 42).
        The next re-formed group (a joiner's) gets the current version."""
        self._settle()
        if not self.rollouts:
            return 0.0
        start = time.perf_counter()
        deadline = self.timeout_s + 10  # the RPC outlives the group's own timeout, which reports first
        push = self._pool.submit(self._push, version, deadline)
        pulls = [self._pool.submit(r.pull_weights, version, deadline, self.verify) for r in self.rollouts]
        # A pull that fails (the replica is gone) ends the sync at once: the push would only wait out
        # its timeout for that receiver (issue 32: 120 s before the run said no replica was left).
        # What is still running is waited for before the next push (_settle).
        done, _ = wait([push, *pulls], return_when=FIRST_EXCEPTION)
        try:
            failed = {r: p.exception() for r, p in zip(self.rollouts, pulls)
                      if p in done and p.exception() is not None}
            if failed:
                log.warning("a rollout's pull failed; not waiting for the push", version=version,
                            replicas=[r.address for r in failed])
                if not push.done():
                    self._abort(failed)
                gone = {r: exc for r, exc in failed.items() if member_failed(exc)}
                raise MembersFailed("pull", gone) if gone else next(iter(failed.values()))
            pushed = push.result()
        except BaseException:
            self._leftover = [f for f in (push, *pulls) if not f.done()]
            raise
        for rollout, pull in zip(self.rollouts, pulls):
            pulled = pull.result()
            if pulled.version != version:
                raise VersionMismatch(f"rollout at {rollout.address} serves version {pulled.version} "
                                      f"after a push of {version}")
            if self.verify and pulled.digest != pushed.digest:
                raise WeightSyncError(f"rollout at {rollout.address}: weights of version {version} "
                                      "differ from "
                                      f"the learner's (digest {pulled.digest} != {pushed.digest})")
        self.forget()
        return time.perf_counter() - start

    def _abort(self, failed: dict[RolloutClient, BaseException]) -> None:
        """A member failed inside the sync: the collective cannot complete without it, so the learner's
        push is ended now (it would wait out the rank wait or the group's timeout for that member, and
        the next open waits for it: _settle); the other members' pulls then fail at once too. Best
        effort: a learner that does not answer leaves the push to its timeout, as before."""
        first = next(iter(failed.items()))
        reason = f"the pull of the rollout at {first[0].address} failed: {first[1]}"
        if len(failed) > 1:
            reason += f" (and {len(failed) - 1} more)"
        try:
            pushing = self.learner.abort_weight_group(self.group, reason)
            log.info("aborted the learner's push", group=self.group, pushing=pushing)
        except RlfleetError as exc:
            log.warning("could not abort the learner's push; it ends at its timeout", group=self.group,
                        error=str(exc))

    def _push(self, version: int, deadline: float) -> Any:
        """The learner's push, asked again while it is refused Busy (another push holds the learner,
        which refuses rather than queues): the pulls started beside it are waiting for this very push,
        so it is retried, with backoff, for the group's timeout rather than given up (issue 42)."""
        end, delay = time.monotonic() + self.timeout_s, BUSY_RETRY_FIRST_S
        while True:
            try:
                return self.learner.push_weights(version, deadline, self.verify, self.group)
            except Busy:
                if time.monotonic() + delay > end:
                    raise
                log.info("the learner is busy with another weight operation; pushing again", version=version,
                         retry_s=delay)
                time.sleep(delay)
                delay = min(delay * 2, BUSY_RETRY_MAX_S)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._calls.shutdown(wait=False, cancel_futures=True)
