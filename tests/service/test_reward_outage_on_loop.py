"""A reward outage met by a Score call on the event loop (Recovery.score_async, issue 44) is handled as
the blocking path handles it: journalled once when it begins and once when it ends, the groups scored
again until a call succeeds, and the run goes on; over real gRPC to a reward service that refuses."""
from __future__ import annotations

import json

import grpc
import pytest

from controller.clients import RewardClient
from controller.journal import Journal
from controller.loop import GRPOLoop
from controller.outputs import RunWriter
from rlfleet.config import JobConfig
from rlfleet.data.prompts import Prompt, PromptSource
from tests.reward_servers import Behaviour, RunningFaulty
from tests.unit.test_admission_handoff import FleetRollout
from tests.unit.test_loop_recovery import FakeLearner, Faults, run_loop

pytestmark = [pytest.mark.service, pytest.mark.timeout(180)]


def test_an_outage_on_the_loop_is_waited_out_journalled_once_and_the_run_goes_on(tmp_path) -> None:
    cfg = JobConfig.model_validate({
        "run": {"output_dir": str(tmp_path), "name": "outage"},
        "controller": {"prompts_per_step": 4, "max_staleness": 1, "max_steps": 2,
                       "prompts_per_request": 2, "service_wait_s": 60},
        "reward": {"max_outage_s": 120},
        "rollout": {"n": 4}})
    prompts = [Prompt(index=i, text=f"p{i}", prompt_ids=[1, 2], data_source="digits", ground_truth="1")
               for i in range(32)]
    server = RunningFaulty(Behaviour(fail_first=3, fail_code=grpc.StatusCode.UNAVAILABLE))
    reward = RewardClient(server.address, timeout_s=60, connect_timeout_s=10)
    learner = FakeLearner(Faults())
    loop = GRPOLoop(cfg, PromptSource(prompts, seed=0), [FleetRollout("fake-rollout:1000")], reward,
                    learner, RunWriter(tmp_path, tensorboard=False), journal=Journal(tmp_path))
    try:
        assert run_loop(loop) is None
    finally:
        reward.close()
        server.stop()
    assert learner.trained_steps == [1, 2]
    assert server.servicer.calls > 3  # the refused calls, then the ones that scored
    journal = [json.loads(line) for line in (tmp_path / "journal" / "prompts.jsonl").read_text().splitlines()]
    events = [e["event"] for e in journal if e["event"] in ("reward_outage", "reward_back")]
    assert events == ["reward_outage", "reward_back"]
    assert loop.recovery.reward_outage.outages == 1
