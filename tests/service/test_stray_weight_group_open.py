"""A stray OpenWeightGroup cannot take the run's weight group away or block its push (issue 32).

The reliability re-run sent one OpenWeightGroup to the learner of a running job without a token (the
default): the learner replaced the controller's group with the stray one, the next push found
"Busy: OpenWeightGroup is in progress" (the stray Open waited for the step's lock while holding the
weight lock), and the controller, which did not take Busy for a passing state, ended the job (4 of 4).

Now a group is named by the address Open returned and the controller pushes to its own: a stray Open
makes a group of its own that nobody pushes to. Open takes neither the step's lock nor the weight
operation's, so it never makes a push wait or refuses one. Real learner and rollout servicers, the
controller's own clients and WeightSync.
"""
from __future__ import annotations

import threading
import time

import grpc
import pytest

from controller.clients import LearnerClient, RolloutClient
from controller.weight_sync import WeightSync
from rlfleet.config import LearnerConfig
from rlfleet.proto.v1 import learner_pb2
from rlfleet.weights import group as weight_group
from tests.service.servicer_harness import ROLES, attach, make_learner, start, stop
from tests.service.test_learner_servicer import train_request

pytestmark = [pytest.mark.service, pytest.mark.timeout(180)]


@pytest.fixture
def services(hf_engine, tiny_model_dir, tmp_path, monkeypatch):
    # A push waiting for a rank that never comes fails after MEMBER_WAIT_S (15 s here; only a failing
    # run waits it out); a push to the controller's own group takes well under a second idle, a few
    # seconds at most on a loaded machine: a third of it.
    monkeypatch.setattr(weight_group, "MEMBER_WAIT_S", 15.0)
    rollout, learner = start("rollout"), start("learner")
    attach("rollout", rollout, hf_engine)
    attach("learner", learner, make_learner(tiny_model_dir, LearnerConfig(lr=1e-3), tmp_path))
    learner_client = LearnerClient(learner.server.address, timeout_s=60)
    rollout_client = RolloutClient(rollout.server.address, timeout_s=60)
    sync = WeightSync(learner_client, [rollout_client], timeout_s=30)
    yield learner, sync, learner_client
    sync.close()
    learner_client.close()
    rollout_client.close()
    stop(rollout)
    stop(learner)


def _stray_open(learner) -> str:
    stub = ROLES["learner"].stub_cls(learner.channel)
    return stub.OpenWeightGroup(learner_pb2.OpenWeightGroupRequest(world_size=2, timeout_s=30),
                                timeout=10).address


def test_a_stray_open_leaves_the_runs_group_in_place(services):
    learner, sync, learner_client = services
    own = sync.open()
    sync.sync(0)
    stray = _stray_open(learner)
    assert stray != own
    assert learner_client.train(_batch(1, 0)).policy_version == 1
    began = time.monotonic()
    sync.sync(1)  # to the controller's group, which the stray Open did not replace
    assert time.monotonic() - began < weight_group.MEMBER_WAIT_S / 3, "the push waited for the stray group"


def test_an_open_during_a_step_neither_waits_for_it_nor_blocks_the_push(services):
    learner, sync, learner_client = services
    sync.open()
    sync.sync(0)
    core = learner.servicer.learner
    opened: list[float] = []
    with core._lock:  # a training step in progress holds the learner's lock
        began = time.monotonic()
        stray = threading.Thread(
            target=lambda: (_stray_open(learner), opened.append(time.monotonic() - began)))
        stray.start()
        stray.join(10)
        assert opened, "the stray Open waited for the step to end"
    assert learner_client.train(_batch(1, 0)).policy_version == 1
    sync.sync(1)  # not refused as Busy


def test_a_push_to_a_group_the_learner_no_longer_has_is_named(services):
    learner, sync, _ = services
    stub = ROLES["learner"].stub_cls(learner.channel)
    with pytest.raises(grpc.RpcError) as err:
        stub.PushWeights(learner_pb2.PushWeightsRequest(version=0, group="127.0.0.1:1"), timeout=30)
    assert err.value.code() == grpc.StatusCode.ABORTED
    assert "no weight group at 127.0.0.1:1" in err.value.details(), err.value.details()


def _batch(step: int, expected_version: int):
    from rlfleet.rpc import convert

    return convert.train_batch_from_proto(train_request(step=step, expected_version=expected_version))
