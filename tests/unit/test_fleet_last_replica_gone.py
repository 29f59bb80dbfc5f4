"""The last replica gone during a push: the run says so and stops within controller.service_wait_s
(issue 32).

The reliability re-run drained the last replica of a run: the next push waited the whole
learner.weight_sync_timeout_s (120 s) for a receiver that was gone before the controller said that
no replica was left, and the run stopped 154 s after the drain where controller.service_wait_s=30
promised about 30 s. Here the only replica dies just before a push (its pull is refused at once) and
the learner's push waits out its timeout, as a learner waiting for a rank that never comes does. The
controller must not wait for that push: a pull that failed is enough to re-form the group, and with
no replica left the run ends after controller.service_wait_s with a line that says why.
"""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from controller.fleet import Fleet
from controller.journal import Journal
from controller.loop import GRPOLoop
from controller.outputs import RunWriter
from rlfleet.config import JobConfig
from rlfleet.data.prompts import Prompt, PromptSource
from rlfleet.errors import ServiceUnavailable
from rlfleet.models.identity import identity_of
from tests.unit.test_fleet_first_group import ARCH, JoiningRollout
from tests.unit.test_loop_recovery import FakeLearner, FakeReward, Faults, run_loop

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]

SYNC_TIMEOUT_S = 60.0  # learner.weight_sync_timeout_s: what the push waits for a receiver that is gone
SERVICE_WAIT_S = 2.0


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch):
    import controller.recovery

    monkeypatch.setattr(controller.recovery, "RETRY_FIRST_S", 0.05)


class DyingRollout(JoiningRollout):
    """Dies once `dead` is set: every call is refused at once, as a stopped process's port is."""

    def __init__(self, address: str) -> None:
        super().__init__(address)
        self.dead = threading.Event()

    def _alive(self) -> None:
        if self.dead.is_set():
            raise ServiceUnavailable(f"rollout service at {self.address}: failed with UNAVAILABLE: "
                                     "Connection refused")

    def status(self, timeout_s: float = 10.0):
        self._alive()
        return super().status(timeout_s)

    def pull_weights(self, version, timeout_s, digest=False):
        self._alive()
        return super().pull_weights(version, timeout_s, digest)

    def generate(self, requests, params, payload_sink=""):
        self._alive()
        yield from super().generate(requests, params)


class WaitingLearner(FakeLearner):
    """Its push waits for every receiver: out to its timeout when one is gone (or until the test, done,
    sets `released`: a thread left sleeping would hold the interpreter's exit)."""

    def __init__(self, faults: Faults, replica: DyingRollout) -> None:
        super().__init__(faults)
        self.replica = replica
        self.released = threading.Event()

    def train(self, batch):
        result = super().train(batch)
        if batch.step == 2:
            self.replica.dead.set()  # gone between this step's Train and its push
        return result

    def abort_weight_group(self, group, reason) -> bool:
        self.released.set()  # the waiting push ends (AbortWeightGroup, issue 44)
        return True

    def push_weights(self, version, timeout_s, digest=False, group=""):
        if self.replica.dead.is_set():
            self.released.wait(SYNC_TIMEOUT_S)
            raise ServiceUnavailable("unreachable")
        return SimpleNamespace(digest="d")


def test_the_last_replica_gone_before_a_push_ends_the_run_after_service_wait_s(tmp_path):
    cfg = JobConfig.model_validate({
        "run": {"output_dir": str(tmp_path), "name": "fleet"},
        "controller": {"prompts_per_step": 2, "max_staleness": 0, "max_steps": 50, "prompts_per_request": 2,
                       "service_wait_s": SERVICE_WAIT_S},
        "learner": {"weight_sync_timeout_s": SYNC_TIMEOUT_S},
        "rollout": {"n": 4}})
    prompts = [Prompt(index=i, text=f"p{i}", prompt_ids=[1, 2], data_source="digits", ground_truth="1")
               for i in range(16)]
    replica = DyingRollout("only:1")
    journal = Journal(tmp_path)
    fleet = Fleet([], architecture=ARCH, connect=lambda address: replica, note=journal.record)
    faults = Faults()
    learner = WaitingLearner(faults, replica)
    loop = GRPOLoop(cfg, PromptSource(prompts, seed=0), [], FakeReward(faults), learner,
                    RunWriter(tmp_path, tensorboard=False), journal=journal, fleet=fleet)
    threading.Timer(0.2, lambda: fleet.join("only:1", "", identity_of(ARCH))).start()
    began = time.monotonic()
    try:
        error = run_loop(loop, limit_s=100)
    finally:
        learner.released.set()
    took = time.monotonic() - began
    assert isinstance(error, ServiceUnavailable), repr(error)
    assert "no rollout replica" in str(error), str(error)
    assert took < SERVICE_WAIT_S + 15, f"the run stopped {took:.1f}s in, after waiting out the push"
