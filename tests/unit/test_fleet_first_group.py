"""A replica accepted while the first weight group forms must not go live without the weights (issue 32).

The reliability re-run started a run with no replica and two joining 0.15 s apart (the start of
`compose up --scale rollout=2`): in 2 of 8 runs the second one, accepted while the first group was
being formed over the first alone, was marked live anyway (the loop committed the fleet read again
after the group formed) and generated at version 0 for all 30 steps with weights the run never sent.
Here the second Join lands deterministically inside the first group's weight pull. Every replica
must hold the weights the controller pushed before it generates, and the late joiner must be taken
into a re-formed group at the next boundary.
"""
from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from controller.fleet import LIVE, Fleet
from controller.journal import Journal, read_journal
from controller.loop import GRPOLoop
from controller.outputs import RunWriter
from rlfleet.config import JobConfig
from rlfleet.data.prompts import Prompt, PromptSource
from rlfleet.models.identity import identity_of
from rlfleet.types import Completion, GroupResult, ServiceStatus
from tests.unit.test_loop_recovery import FakeLearner, FakeReward, Faults, run_loop

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]

ARCH = {"model_type": "qwen2", "hidden_size": 8, "tokenizer": "t"}


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch):
    import controller.recovery

    monkeypatch.setattr(controller.recovery, "RETRY_FIRST_S", 0.05)


class JoiningRollout:
    """A replica that joined the fleet: it serves no version of the run's weights (-1) until a pull
    gave it one. `during_pull` runs inside its first pull (another replica's Join arrives then)."""

    def __init__(self, address: str, during_pull=None) -> None:
        self.address, self.version = address, -1
        self.during_pull = during_pull
        self.generated_without_weights = 0
        self.pulls: list[int] = []

    def status(self, timeout_s: float = 10.0) -> ServiceStatus:
        return ServiceStatus("rollout", True, max(self.version, 0), stats={"weight_ranks": 1})

    def kept_status(self) -> None:
        return None  # no kept-alive channel watches it: every re-form asks its status

    def join_weight_group(self, *args) -> None:
        pass

    def pull_weights(self, version, timeout_s, digest=False):
        if self.during_pull is not None:
            hook, self.during_pull = self.during_pull, None
            hook()
        self.version = version
        self.pulls.append(version)
        return SimpleNamespace(version=version, digest="d")

    def generate(self, requests, params, payload_sink=""):
        if self.version < 0:
            self.generated_without_weights += 1
        for request in requests:
            yield GroupResult(request.request_id, [
                Completion(token_ids=[5, 6, 7], logprobs=[-0.5] * 3, finish_reason="stop",
                           policy_version=max(self.version, 0), text=str(i % 2)) for i in range(params.n)])

    def close(self) -> None:
        pass


def test_a_replica_accepted_while_the_first_group_forms_gets_the_weights_before_it_works(tmp_path):
    cfg = JobConfig.model_validate({
        "run": {"output_dir": str(tmp_path), "name": "fleet"},
        "controller": {"prompts_per_step": 2, "max_staleness": 1, "max_steps": 4, "prompts_per_request": 1,
                       "service_wait_s": 30},
        "rollout": {"n": 4}})
    prompts = [Prompt(index=i, text=f"p{i}", prompt_ids=[1, 2], data_source="digits", ground_truth="1")
               for i in range(16)]
    replicas: dict[str, JoiningRollout] = {}
    fleet_box: list[Fleet] = []

    def second_joins() -> None:  # the second replica's Join, accepted while the first group forms
        fleet_box[0].join("second:2", "", identity_of(ARCH))

    replicas["first:1"] = JoiningRollout("first:1", during_pull=second_joins)
    replicas["second:2"] = JoiningRollout("second:2")
    journal = Journal(tmp_path)
    fleet = Fleet([], architecture=ARCH, connect=lambda address: replicas[address], note=journal.record)
    fleet_box.append(fleet)
    faults = Faults()
    loop = GRPOLoop(cfg, PromptSource(prompts, seed=0), [], FakeReward(faults), FakeLearner(faults),
                    RunWriter(tmp_path, tensorboard=False), journal=journal, fleet=fleet)
    threading.Timer(0.2, lambda: fleet.join("first:1", "", identity_of(ARCH))).start()
    assert run_loop(loop) is None
    first, second = replicas["first:1"], replicas["second:2"]
    assert first.generated_without_weights == 0
    assert second.generated_without_weights == 0, "the second replica worked without the run's weights"
    assert second.pulls and second.pulls[0] >= 0, second.pulls  # a re-formed group gave it the weights
    joined = [e for e in read_journal(tmp_path / "journal" / "prompts.jsonl") if e["event"] == "joined"]
    assert [e["replica"] for e in joined] == ["first:1", "second:2"], joined
    assert all(m.state == LIVE for m in fleet.members())
