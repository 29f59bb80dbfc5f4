"""Drives one weight transaction: the learner pushes while every rollout pulls."""
from __future__ import annotations

import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

import structlog

from rlfleet.errors import VersionMismatch, WeightSyncError
from controller.clients import LearnerClient, RolloutClient

log = structlog.get_logger(__name__)

MAX_REPLICAS = 256  # rollout replicas a weight group can hold


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
        self.group = ""  # the group open() formed, by address: pushes name it (the learner may host others)

    def open(self) -> str:
        """Opens the learner's group and has every rollout join it; returns the rendezvous address."""
        # A replica takes one rank per tensor-parallel worker; the learner is rank 0.
        statuses = [r.status() for r in self.rollouts]
        ranks = [int(s.stats.get("weight_ranks", 1)) for s in statuses]
        world_size = 1 + sum(ranks)
        # Each replica's placement lets the learner pick the transport (CUDA IPC on its own GPU);
        # one unknown placement leaves the choice to the learner's host alone.
        placements = [s.placement for s in statuses]
        address, backend = self.learner.open_weight_group(
            world_size, self.timeout_s, placements if all(placements) else None)
        base = 1
        for rollout, count in zip(self.rollouts, ranks):
            rollout.join_weight_group(address, base, world_size, backend, self.timeout_s)
            base += count
        self.group = address
        log.info("weight group opened", address=address, backend=backend, members=world_size,
                 replicas=len(self.rollouts))
        return address

    def sync(self, version: int) -> float:
        """Pushes `version` to every rollout; returns the seconds until all of them serve it."""
        start = time.perf_counter()
        deadline = self.timeout_s + 10  # the RPC outlives the group's own timeout, which reports first
        push = self._pool.submit(self.learner.push_weights, version, deadline, self.verify, self.group)
        pulls = [self._pool.submit(r.pull_weights, version, deadline, self.verify) for r in self.rollouts]
        # A pull that fails (the replica is gone) ends the sync at once: the push would only wait out
        # its timeout for that receiver (issue 32: 120 s before the run said no replica was left).
        done, _ = wait([push, *pulls], return_when=FIRST_EXCEPTION)
        for rollout, pull in zip(self.rollouts, pulls):
            if pull in done and pull.exception() is not None:
                log.warning("a rollout's pull failed; not waiting for the push", replica=rollout.address,
                            version=version)
                raise pull.exception()
        pushed = push.result()
        for rollout, pull in zip(self.rollouts, pulls):
            pulled = pull.result()
            if pulled.version != version:
                raise VersionMismatch(f"rollout at {rollout.address} serves version {pulled.version} "
                                      f"after a push of {version}")
            if self.verify and pulled.digest != pushed.digest:
                raise WeightSyncError(f"rollout at {rollout.address}: weights of version {version} "
                                      "differ from "
                                      f"the learner's (digest {pulled.digest} != {pushed.digest})")
        return time.perf_counter() - start

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
