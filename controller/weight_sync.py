"""Drives one weight transaction: the learner pushes while every rollout pulls."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from rlfleet.errors import VersionMismatch
from controller.clients import LearnerClient, RolloutClient


class WeightSync:
    def __init__(self, learner: LearnerClient, rollouts: list[RolloutClient], timeout_s: float):
        self.learner = learner
        self.rollouts = rollouts
        self.timeout_s = timeout_s
        self._pool = ThreadPoolExecutor(max_workers=1 + len(rollouts), thread_name_prefix="weight-sync")

    def open(self) -> str:
        """Opens the learner's group and has every rollout join it; returns the rendezvous address."""
        address, backend = self.learner.open_weight_group(1 + len(self.rollouts), self.timeout_s)
        for rank, rollout in enumerate(self.rollouts, start=1):
            rollout.join_weight_group(address, rank, 1 + len(self.rollouts), backend, self.timeout_s)
        return address

    def sync(self, version: int) -> float:
        """Pushes `version` to every rollout; returns the seconds until all of them serve it."""
        start = time.perf_counter()
        push = self._pool.submit(self.learner.push_weights, version, self.timeout_s + 10)
        pulls = [self._pool.submit(r.pull_weights, version, self.timeout_s + 10) for r in self.rollouts]
        push.result()
        for rollout, pull in zip(self.rollouts, pulls):
            served = pull.result().version
            if served != version:
                raise VersionMismatch(f"rollout at {rollout.address} serves version {served} after a push of {version}")
        return time.perf_counter() - start

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
