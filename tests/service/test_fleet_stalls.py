"""Ways the fleet and the weight sync stalled a run without saying so (issue 42, items 1-4).

1. A Generate stream that ended OK but short left its missing prompts in flight until the run stopped
   (only a failed stream re-queued them): their admission slots were never given back.
2. The only replica drained: the group was re-formed over nobody, and the next push went to the
   learner's previous group and waited out learner.weight_sync_timeout_s for a receiver that had left.
3. One stray PushWeights (OpenWeightGroup(world_size=2) then PushWeights, no token set): the learner
   held its one push slot while that push waited for a rank that never came, the controller's push was
   refused Busy, and the rollout's pull beside it waited out the group's timeout.
4. A Join naming the address of a replica the run started replaced that replica (run-started members
   have no process id to compare with).

Real learner, rollout and reward servicers on the tiny model behind in-process gRPC servers, a real gloo
weight group, and the controller's own Fleet, Recovery, WeightSync and loop over real clients. The
timeouts are small (config), and each bound asserted is far below the stall it replaces.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch

from controller.clients import LearnerClient, RewardClient, RolloutClient
from controller.fleet import JOIN_CHECK_S, LEAVING, Fleet
from controller.journal import Journal, audit, read_journal
from controller.loop import GRPOLoop
from controller.outputs import RunWriter
from rlfleet.config import JobConfig, LearnerConfig
from rlfleet.data.prompts import Prompt, PromptSource
from rlfleet.errors import FleetRefused
from rlfleet.models.identity import architecture
from rlfleet.proto.v1 import learner_pb2, learner_pb2_grpc
from rlfleet.types import GroupResult, PromptRequest, SamplingParams
from rlfleet.weights import group as weight_group
from rlfleet.weights.digest import weights_digest
from services.reward.scorer import RewardScorer
from services.rollout.engines.hf import HFEngine
from tests.service.servicer_harness import CPU, TIMEOUT, Running, attach, make_learner, start, stop
from tests.service.test_learner_servicer import train_request
from tests.unit.test_loop_recovery import run_loop

pytestmark = [pytest.mark.service, pytest.mark.timeout(240)]

SYNC_TIMEOUT_S = 40.0  # learner.weight_sync_timeout_s: what a push or pull waits for at most
MEMBER_WAIT_S = 9.0  # a rank missing at the rendezvous for this long is not coming
SERVICE_WAIT_S = 20.0  # controller.service_wait_s


class ShortEngine(HFEngine):
    """The tiny model's engine in a replica whose streams can end early, without an error: with `short`
    set it sends the first group of a request and then ends the stream OK (as the fleet simulator's
    engine does when its replica is killed: bench/fleetsim/engine.py)."""

    short = False

    def generate(self, prompts: list[PromptRequest], params: SamplingParams) -> Iterator[GroupResult]:
        for group in super().generate(prompts, params):
            yield group
            if self.short:
                return


@pytest.fixture
def fleet_of(tiny_model_dir: Path, tmp_path: Path, monkeypatch):
    """`fleet_of(names, founders, **controller)`: a learner, a reward server, a replica per name, and the
    controller's loop whose fleet starts with the first `founders` of them (the others may join)."""
    monkeypatch.setattr(weight_group, "MEMBER_WAIT_S", MEMBER_WAIT_S)
    monkeypatch.setattr("controller.recovery.RETRY_FIRST_S", 0.1)
    made: list[object] = []
    learner = start("learner")
    made.append(learner)
    attach("learner", learner, make_learner(tiny_model_dir, LearnerConfig(lr=1e-3), tmp_path / "checkpoints"))
    reward = start("reward")
    made.append(reward)
    attach("reward", reward, RewardScorer("tests.reward_fixtures:score"))

    def build(names: list[str], founders: int, **controller):
        replicas = {}
        for name in names:
            running = start("rollout")
            engine = ShortEngine(tiny_model_dir, CPU, torch.float32, max_batch_sequences=4)
            engine.running = running
            attach("rollout", running, engine)
            replicas[name] = engine
            made.append(running)

        def client(address: str) -> RolloutClient:
            made.append(RolloutClient(address, timeout_s=60, connect_timeout_s=JOIN_CHECK_S,
                                      report_every_s=None))
            return made[-1]
        learner_client = LearnerClient(learner.server.address, timeout_s=60, connect_timeout_s=10)
        reward_client = RewardClient(reward.server.address, timeout_s=60, connect_timeout_s=10)
        made.extend([learner_client, reward_client])
        journal = Journal(tmp_path)
        fleet = Fleet([client(replicas[n].running.server.address) for n in names[:founders]],
                      architecture=architecture(tiny_model_dir), connect=client, note=journal.record)
        cfg = JobConfig.model_validate({
            "run": {"output_dir": str(tmp_path), "name": "stalls"},
            "learner": {"weight_sync_timeout_s": SYNC_TIMEOUT_S},
            "rollout": {"n": 2, "max_new_tokens": 4},
            "controller": {"service_wait_s": SERVICE_WAIT_S, **controller}})
        prompts = [Prompt(index=i, text=f"p{i}", prompt_ids=[6, 7, 41 + i % 4, 8], data_source="digits",
                          ground_truth="1") for i in range(32)]
        loop = GRPOLoop(cfg, PromptSource(prompts, seed=0), [m.client for m in fleet.members()],
                        reward_client, learner_client, RunWriter(tmp_path, tensorboard=False),
                        journal=journal, fleet=fleet)
        made.append(loop.sync)
        return learner, replicas, loop, journal

    yield build
    for thing in reversed(made):
        if isinstance(thing, Running):
            stop(thing)
        else:
            thing.close()


def _train(learner: Running, step: int) -> None:
    stub = learner_pb2_grpc.LearnerStub(learner.channel)
    reply = stub.Train(train_request(step=step, expected_version=step - 1), timeout=TIMEOUT)
    assert reply.policy_version == step


def _holds_learners_weights(engine: HFEngine, learner: Running, version: int) -> bool:
    return (engine.policy_version == version
            and engine.weights_digest() == weights_digest(learner.servicer.learner.named_weights()))


# ---- 1: a stream that ends OK but short -----------------------------------------------------------

def test_a_stream_that_ends_ok_but_short_requeues_its_missing_prompts(fleet_of):
    """Every request of two prompts comes back with one group. Before, the other prompt stayed admitted
    and in flight for good: at max_staleness=0 a step's two slots were then held by prompts nobody
    generated, and the run waited for ever (until this test's limit). Now the missing prompt is
    re-queued at once (journal: `requeued`, reason `stream_ended_short`), generated by the next request
    and trained once."""
    learner, replicas, loop, journal = fleet_of(["a"], founders=1, prompts_per_step=2, prompts_per_request=2,
                                                max_staleness=0, max_steps=3)
    replicas["a"].short = True
    error = run_loop(loop, limit_s=90)
    assert error is None, repr(error)
    assert loop.step == 3
    events = read_journal(journal.path)
    short = [e for e in events if e["event"] == "requeued" and e["reason"] == "stream_ended_short"]
    assert short, "no prompt was re-queued after a short stream"
    result = audit(journal.path)
    assert result.lost == [] and result.trained_twice == []
    # a re-queued prompt was generated by a later request and trained once, or the run ended before it
    # came back (it is open, re-queued for a resume)
    assert all(result.trained.get(e["seq"]) == 1 or e["seq"] in result.open for e in short), short
    assert any(result.trained.get(e["seq"]) == 1 for e in short), short


# ---- 2: the last replica drained ------------------------------------------------------------------

def test_after_the_only_replica_drained_no_push_waits_for_it(fleet_of):
    """The replica leaves as `rlfleet fleet drain` (or a Leave) makes it: the group is re-formed over
    nobody at the next boundary. The learner's next versions have no receiver: the push of each must
    not go to the previous group (it waited out learner.weight_sync_timeout_s there, 120 s by default,
    before the run said that no replica was left)."""
    learner, replicas, loop, journal = fleet_of(["a"], founders=1)
    loop.recovery.resync(0)
    [member] = loop.fleet.members()
    leaving = threading.Thread(target=loop.fleet.leave, args=(member.address, 5.0), daemon=True)
    leaving.start()
    deadline = time.monotonic() + 30
    while member.state != LEAVING:
        assert time.monotonic() < deadline, "the member never started leaving"
        time.sleep(0.01)
    loop.fleet.generation_ended(member)  # what its generation task does once it sees it takes no work
    _train(learner, 1)
    loop.recovery.sync(1)  # the boundary: the group is re-formed without it
    leaving.join(30)
    assert member.gone.is_set() and loop.fleet.members() == []
    _train(learner, 2)
    began = time.monotonic()
    loop.recovery.sync(2)  # nobody to push to
    took = time.monotonic() - began
    assert took < MEMBER_WAIT_S / 3, f"the push of version 2 waited {took:.1f}s for a replica that left"
    kinds = [e["event"] for e in read_journal(journal.path)]
    assert "weight_sync_failed" not in kinds, kinds


# ---- 3: a stray push ------------------------------------------------------------------------------

def test_a_stray_push_to_a_group_of_its_own_neither_refuses_nor_delays_the_runs_push(fleet_of):
    """Anyone who reaches the learner (no token set) opens a group of world size 2 and pushes to it; no
    rank ever joins it. The run's push of the same moment must go through at once, and the replica hold
    the new weights; the stray push fails on its own after MEMBER_WAIT_S."""
    learner, replicas, loop, journal = fleet_of(["a"], founders=1)
    loop.recovery.resync(0)
    _train(learner, 1)
    stub = learner_pb2_grpc.LearnerStub(learner.channel)
    stub.OpenWeightGroup(learner_pb2.OpenWeightGroupRequest(world_size=2), timeout=TIMEOUT)
    stray = stub.PushWeights.future(learner_pb2.PushWeightsRequest(version=1), timeout=SYNC_TIMEOUT_S + 10)
    deadline = time.monotonic() + 30
    while loop.learner.status().in_flight < 1:  # the stray push is at its rendezvous, waiting for rank 1
        assert time.monotonic() < deadline and not stray.done(), "the stray push never started"
        time.sleep(0.01)
    began = time.monotonic()
    loop.recovery.sync(1)
    took = time.monotonic() - began
    assert took < MEMBER_WAIT_S / 3, f"the run's push took {took:.1f}s beside a stray one"
    assert not stray.done(), "the stray push ended before the run's push was measured against it"
    assert _holds_learners_weights(replicas["a"], learner, 1)
    with pytest.raises(grpc.RpcError) as err:
        stray.result()
    assert "did not connect" in err.value.details(), err.value.details()
    kinds = [e["event"] for e in read_journal(journal.path)]
    assert "weight_sync_failed" not in kinds, kinds


def test_a_stray_push_naming_no_group_never_lands_on_the_runs_group(fleet_of):
    """The stray client's group is closed by the run's next push (a push to one group closes the
    others). Its PushWeights, naming no group, then went to "the group opened last" that was left: the
    run's own, whose replica was not pulling. It held the learner until the group's timeout, the run's
    Train was refused Busy meanwhile, and a real run stopped after controller.service_wait_s (seen with
    `rlfleet run`, 2 tries of 2). It must be refused at once, and the run's next step go through."""
    learner, replicas, loop, journal = fleet_of(["a"], founders=1)
    loop.recovery.resync(0)
    stub = learner_pb2_grpc.LearnerStub(learner.channel)
    stray = stub.OpenWeightGroup(learner_pb2.OpenWeightGroupRequest(world_size=2), timeout=TIMEOUT).address
    _train(learner, 1)
    loop.recovery.sync(1)  # the run's push to its group closes the stray group
    began = time.monotonic()
    with pytest.raises(grpc.RpcError) as err:
        stub.PushWeights(learner_pb2.PushWeightsRequest(version=1), timeout=SYNC_TIMEOUT_S + 10)
    took = time.monotonic() - began
    assert took < MEMBER_WAIT_S / 3, f"the stray push held the learner {took:.1f}s"
    assert stray in err.value.details() and "closed" in err.value.details(), err.value.details()
    _train(learner, 2)  # not refused: nothing holds the learner
    loop.recovery.sync(2)
    assert _holds_learners_weights(replicas["a"], learner, 2)


# ---- 4: a spoofed Join ----------------------------------------------------------------------------

def test_a_join_naming_a_run_started_replicas_address_does_not_replace_it(fleet_of):
    """A Join (anyone's, without a token) naming the address of a replica the run started: the replica
    answers the controller's call-back there, so the Join looked like a restarted process and replaced
    the member with a joined one (which a Leave could then take out of the run). It is refused, naming
    why, and the member stays as it is."""
    learner, replicas, loop, journal = fleet_of(["a"], founders=1)
    loop.recovery.resync(0)
    [member] = loop.fleet.members()
    with pytest.raises(FleetRefused, match="started with"):
        loop.fleet.join(member.address, "spoof", loop.fleet.identity)
    assert loop.fleet.members() == [member] and not member.gone.is_set() and not member.joined
    kinds = [e["event"] for e in read_journal(journal.path)]
    assert "join_accepted" not in kinds and "left" not in kinds, kinds
