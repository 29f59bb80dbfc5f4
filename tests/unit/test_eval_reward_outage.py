"""Periodic evaluation meets a reward outage as training does (issue 22): it waits it out with
backoff, says so once (journal `reward_outage` / `reward_back`), and the run stops only after
reward.max_outage_s. Before, one UNAVAILABLE from the reward service during validation ended the run."""
from __future__ import annotations

import pytest

from controller.evaluation import PeriodicEval
from controller.journal import Journal, read_journal
from controller.loop import GRPOLoop
from controller.outputs import RunWriter
from controller.reward_outage import RewardOutageExpired
from rlfleet.config import JobConfig
from rlfleet.data.prompts import Prompt, PromptSource
from rlfleet.errors import ServiceUnavailable
from tests.unit.test_loop_recovery import FakeLearner, FakeReward, FakeRollout, Faults, run_loop

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch):
    """The loop's retry backoff from 0.05 s instead of 0.5 s (controller.recovery.RETRY_FIRST_S)."""
    import controller.recovery

    monkeypatch.setattr(controller.recovery, "RETRY_FIRST_S", 0.05)


class EvalOutageReward(FakeReward):
    """The reward service goes down at the first validation Score call and fails every call, the
    training side's too, until `failures` calls have failed: a service that is down refuses
    everyone. (Failing validation calls only let a concurrent training call end the outage in
    between, which no real outage does, and the journal then saw two.)"""

    def __init__(self, faults: Faults, failures: int) -> None:
        super().__init__(faults)
        self.failures, self.down = failures, False

    def score(self, items):
        if items and items[0].id.startswith("eval-") and self.failures > 0:
            self.down = True
        self._refuse_while_down()
        results = super().score(items)
        # A call already in flight when the service went down fails too (its connection is cut):
        # otherwise a training call that checked just before the first validation call could
        # succeed after it and end the outage at once, which the journal then counts twice.
        self._refuse_while_down()
        return results

    def _refuse_while_down(self) -> None:
        if self.down and self.failures > 0:
            self.failures -= 1
            raise ServiceUnavailable("reward service at fake-reward:2: Score failed with UNAVAILABLE: "
                                     "Connection refused")


def _loop(tmp_path, failures: int, max_outage_s: float) -> GRPOLoop:
    cfg = JobConfig.model_validate({
        "run": {"output_dir": str(tmp_path), "name": "fake"},
        "controller": {"prompts_per_step": 2, "max_staleness": 0, "max_steps": 2, "prompts_per_request": 2,
                       "service_wait_s": 20, "eval_every": 1, "eval_before_train": False},
        "rollout": {"n": 4}, "reward": {"max_outage_s": max_outage_s}})
    prompts = [Prompt(index=i, text=f"p{i}", prompt_ids=[1, 2], data_source="digits", ground_truth="1")
               for i in range(16)]
    faults = Faults()
    evaluator = PeriodicEval(cfg, prompts[:3])
    reward = EvalOutageReward(faults, failures)
    return GRPOLoop(cfg, PromptSource(prompts, seed=0), FakeRollout(faults), reward, FakeLearner(faults),
                    RunWriter(tmp_path, tensorboard=False), evaluator=evaluator, journal=Journal(tmp_path))


def test_validation_waits_out_a_reward_outage(tmp_path):
    loop = _loop(tmp_path, failures=3, max_outage_s=60)
    assert run_loop(loop) is None
    kinds = [e["event"] for e in read_journal(tmp_path / "journal" / "prompts.jsonl")]
    assert kinds.count("reward_outage") == 1 and kinds.count("reward_back") == 1, kinds
    assert any(k.startswith("val/") for k in loop.last_metrics), loop.last_metrics


def test_a_validation_outage_longer_than_max_outage_ends_the_run_naming_the_cause(tmp_path):
    loop = _loop(tmp_path, failures=1000, max_outage_s=0.5)
    error = run_loop(loop, limit_s=30)
    assert isinstance(error, RewardOutageExpired), repr(error)
    assert "reward.max_outage_s=0.5" in str(error) and "fake-reward:2" in str(error)
