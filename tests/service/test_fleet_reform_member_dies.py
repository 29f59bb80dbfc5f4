"""A member dies while the weight group is re-formed for a joiner: the re-form leaves it out and goes on,
and the joiner is taken in with the current weights (issue 34).

The fleet simulator at 256 replicas under churn: a re-form walked the members one RPC at a time, a
member killed during the walk failed it, the retry met the next kill, and after two failed tries the
healthy joiners were turned away (`join_failed`: 27 of 51). Here two members die when the re-form
hands them their ranks (a kill landing after the world size was fixed), or one dies at its pull
(after it joined the rendezvous): the joiner must still go live holding the learner's weights of the
version pushed, and the dead must leave the run, journaled.

Real learner and rollout servicers on the tiny model behind in-process gRPC servers, a real gloo
weight group, the controller's own Fleet, Recovery and WeightSync over real clients. A replica "dies"
by its server stopping at once (no grace: its calls in flight are cut), as a kill -9 looks to the
controller.
"""
from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from controller.clients import LearnerClient, RolloutClient
from controller.fleet import JOIN_CHECK_S, LIVE, Fleet
from controller.journal import Journal, read_journal
from controller.loop import GRPOLoop
from rlfleet.config import JobConfig, LearnerConfig
from rlfleet.models.identity import architecture
from rlfleet.proto.v1 import learner_pb2_grpc
from rlfleet.weights import group as weight_group
from rlfleet.weights.digest import weights_digest
from services.rollout.engines.hf import HFEngine
from tests.service.servicer_harness import CPU, TIMEOUT, Running, attach, make_learner, start, stop
from tests.service.test_learner_servicer import train_request

pytestmark = [pytest.mark.service, pytest.mark.timeout(240)]


class MortalEngine(HFEngine):
    """The tiny model's engine, in a replica that dies when a chosen call reaches it (`die_at`: "join"
    or "pull"), or whose JoinWeightGroup waits at `meet` for the other members' (a barrier)."""

    running: Running
    die_at: str = ""
    meet: threading.Barrier | None = None

    def _die_if(self, call: str) -> None:
        if self.die_at == call:
            self.running.server.stop(grace_s=0)  # the call in flight is cut with the server
            raise RuntimeError(f"killed at {call}")  # never answered: the server is gone

    def join_weight_group(self, *args, **kwargs) -> None:
        self._die_if("join")
        if self.meet is not None:
            self.meet.wait()
        super().join_weight_group(*args, **kwargs)

    def pull_weights(self, version: int) -> dict[str, float]:
        self._die_if("pull")
        return super().pull_weights(version)


@pytest.fixture
def fleet_of(tiny_model_dir: Path, tmp_path: Path, monkeypatch):
    """`fleet_of(names, founders)`: a learner, a replica per name, and the controller's loop whose
    fleet starts with the `founders` (the others join later)."""
    monkeypatch.setattr(weight_group, "MEMBER_WAIT_S", 5.0)  # a rendezvous missing a dead rank fails in 5 s
    monkeypatch.setattr("controller.recovery.RETRY_FIRST_S", 0.1)
    made: list[object] = []
    learner = start("learner")
    made.append(learner)
    attach("learner", learner, make_learner(tiny_model_dir, LearnerConfig(lr=1e-3), tmp_path / "checkpoints"))

    def build(names: list[str], founders: int):
        replicas = {}
        for name in names:
            running = start("rollout")
            engine = MortalEngine(tiny_model_dir, CPU, torch.float32, max_batch_sequences=4)
            engine.running = running
            attach("rollout", running, engine)
            replicas[name] = engine
            made.append(running)

        def client(address: str) -> RolloutClient:
            made.append(RolloutClient(address, timeout_s=60, connect_timeout_s=JOIN_CHECK_S,
                                      report_every_s=None))
            return made[-1]
        learner_client = LearnerClient(learner.server.address, timeout_s=60, connect_timeout_s=10)
        made.append(learner_client)
        journal = Journal(tmp_path)
        fleet = Fleet([client(replicas[n].running.server.address) for n in names[:founders]],
                      architecture=architecture(tiny_model_dir), connect=client, note=journal.record)
        cfg = JobConfig.model_validate({"learner": {"weight_sync_timeout_s": 30, "verify_weights": True},
                                        "controller": {"service_wait_s": 60}})
        loop = GRPOLoop(cfg, source=None, rollout=[m.client for m in fleet.members()], reward=None,
                        learner=learner_client, writer=None, journal=journal, fleet=fleet)
        fleet.on_live = lambda member: None  # no generation here: the re-form is what is tested
        made.append(loop.sync)
        return learner, replicas, loop, journal

    yield build
    for thing in reversed(made):
        if isinstance(thing, Running):
            stop(thing)
        else:
            thing.close()


def _join(loop: GRPOLoop, engine: MortalEngine, name: str) -> str:
    address = engine.running.server.address
    fleet = loop.fleet
    fleet.join(address, name, fleet.identity)
    return address


def _train_one_step(learner: Running) -> None:
    stub = learner_pb2_grpc.LearnerStub(learner.channel)
    assert stub.Train(train_request(step=1, expected_version=0), timeout=TIMEOUT).policy_version == 1


def _holds_learners_weights(engine: MortalEngine, learner: Running, version: int) -> bool:
    core = learner.servicer.learner
    return (engine.policy_version == version
            and engine.weights_digest() == weights_digest(core.named_weights()))


def test_two_members_die_as_the_reform_hands_out_ranks_and_the_joiner_is_taken_in(fleet_of):
    learner, replicas, loop, journal = fleet_of(["a", "b", "d", "c"], founders=1)
    b, d = (_join(loop, replicas[n], n) for n in ("b", "d"))
    loop.recovery.resync(0)  # b and d join the group at version 0 and work
    assert {m.address for m in loop.fleet.members() if m.state == LIVE} >= {b, d}
    _train_one_step(learner)  # version 1: other weights than the ones every replica loaded
    replicas["b"].die_at = replicas["d"].die_at = "join"  # killed when the re-form hands them ranks
    c = _join(loop, replicas["c"], "c")

    loop.recovery.sync(1)  # the version boundary: the re-form for c

    members = {m.address: m for m in loop.fleet.members()}
    assert set(members) == {replicas["a"].running.server.address, c}
    assert members[c].state == LIVE
    assert _holds_learners_weights(replicas["c"], learner, 1)
    assert _holds_learners_weights(replicas["a"], learner, 1)
    events = read_journal(journal.path)
    left = {e["replica"]: e["reason"] for e in events if e["event"] == "left"}
    assert left == {b: "unreachable", d: "unreachable"}, left
    assert any(e["event"] == "joined" and e["replica"] == c and e["version"] == 1 for e in events)
    kinds = [e["event"] for e in events]
    assert "weight_group_left_out" in kinds and "weight_group_retry" not in kinds, kinds


def test_a_member_dies_at_its_pull_after_the_rendezvous_was_fixed_and_the_joiner_is_taken_in(fleet_of):
    learner, replicas, loop, journal = fleet_of(["a", "b", "c"], founders=1)
    b = _join(loop, replicas["b"], "b")
    loop.recovery.resync(0)
    _train_one_step(learner)
    replicas["b"].die_at = "pull"  # joined the group of world size 4, never arrives at its rendezvous
    c = _join(loop, replicas["c"], "c")

    loop.recovery.sync(1)

    members = {m.address: m for m in loop.fleet.members()}
    assert set(members) == {replicas["a"].running.server.address, c} and members[c].state == LIVE
    assert _holds_learners_weights(replicas["c"], learner, 1)
    assert _holds_learners_weights(replicas["a"], learner, 1)
    events = read_journal(journal.path)
    assert {e["replica"]: e["reason"] for e in events if e["event"] == "left"} == {b: "unreachable"}
    assert not any(e["event"] == "left" and e["reason"] == "join_failed" for e in events)


def test_the_members_are_asked_at_once_not_one_after_another(fleet_of):
    """Each member's JoinWeightGroup waits until the others' have arrived too: a re-form that asks one
    member after another never gets past the first."""
    learner, replicas, loop, journal = fleet_of(["a", "b", "c"], founders=1)
    meet = threading.Barrier(3, timeout=25)  # within the JoinWeightGroup call's 30 s
    for engine in replicas.values():
        engine.meet = meet
    for name in ("b", "c"):
        _join(loop, replicas[name], name)

    loop.recovery.resync(0)

    assert all(m.state == LIVE for m in loop.fleet.members()) and len(loop.fleet.members()) == 3
    assert all(_holds_learners_weights(e, learner, 0) for e in replicas.values())


def test_a_member_dead_before_the_reform_is_left_out_at_its_status(fleet_of):
    """Killed just before the boundary, not yet noticed by the heartbeat: its status call fails, the
    re-form goes on with the others (asking nobody twice) and the joiner is taken in."""
    learner, replicas, loop, journal = fleet_of(["a", "b", "c"], founders=1)
    b = _join(loop, replicas["b"], "b")
    loop.recovery.resync(0)
    _train_one_step(learner)
    replicas["b"].running.server.stop(grace_s=0)
    c = _join(loop, replicas["c"], "c")

    loop.recovery.sync(1)

    members = {m.address: m for m in loop.fleet.members()}
    assert set(members) == {replicas["a"].running.server.address, c} and members[c].state == LIVE
    assert _holds_learners_weights(replicas["c"], learner, 1)
    events = read_journal(journal.path)
    assert {e["replica"]: e["reason"] for e in events if e["event"] == "left"} == {b: "unreachable"}
    [left_out] = [e for e in events if e["event"] == "weight_group_left_out"]
    assert left_out["stage"] == "status" and left_out["replicas"] == [b]
    [rebuilt] = [e for e in events if e["event"] == "weight_group_rebuilt" and e["version"] == 1]
    assert rebuilt["tries"] == 2 and rebuilt["replicas"] == 2
