"""Every servicer: health before and after its core is attached, stopping, reflection, status.

Servers bind 127.0.0.1 port 0 (the OS picks the port) and are stopped in teardown.
The rollout and learner load the session's tiny random model (tests/conftest.py).
"""
from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from rlfleet.proto.v1 import (
    common_pb2,
    learner_pb2_grpc,
    reward_pb2_grpc,
    rollout_pb2_grpc,
)
from services.learner.servicer import SERVICE_NAME as LEARNER_SERVICE
from services.reward.scorer import RewardScorer
from services.reward.servicer import SERVICE_NAME as REWARD_SERVICE
from services.rollout.servicer import SERVICE_NAME as ROLLOUT_SERVICE
from tests.service.servicer_harness import (
    ROLES,
    TIMEOUT,
    attach,
    call_before_attach,
    code_of,
    make_learner,
)

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]


@pytest.mark.parametrize("role", ["reward", "rollout", "learner"])
def test_not_serving_until_attached(role, started, request):
    running = started(role)
    stub = ROLES[role].stub_cls(running.channel)
    not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
    assert running.health() == not_serving
    assert running.health(running.service_name) == not_serving
    assert code_of(call_before_attach(role, stub)) == grpc.StatusCode.UNAVAILABLE
    status = stub.GetStatus(common_pb2.GetStatusRequest(), timeout=TIMEOUT)
    assert status.role == role and not status.ready
    assert "NotReady" in status.last_error  # the refusal is remembered for `rlfleet status`

    if role == "reward":
        core = RewardScorer("tests.reward_fixtures:score")
    elif role == "rollout":
        core = request.getfixturevalue("hf_engine")
    else:
        core = make_learner(request.getfixturevalue("tiny_model_dir"), request.getfixturevalue("learner_cfg"),
                            request.getfixturevalue("tmp_path") / "ckpt")
    attach(role, running, core)
    serving = health_pb2.HealthCheckResponse.SERVING
    assert running.health() == serving
    assert running.health(running.service_name) == serving
    assert stub.GetStatus(common_pb2.GetStatusRequest(), timeout=TIMEOUT).ready


def test_stopped_server_refuses_work(started):
    running = started("reward")
    attach("reward", running, RewardScorer("tests.reward_fixtures:score"))
    assert running.health() == health_pb2.HealthCheckResponse.SERVING
    running.server.stop(grace_s=0)
    running.server.stop(grace_s=0)  # idempotent
    stub = reward_pb2_grpc.RewardStub(running.channel)
    assert code_of(lambda: stub.GetStatus(common_pb2.GetStatusRequest(), timeout=20)) \
        == grpc.StatusCode.UNAVAILABLE


# ---- (b) reward ---------------------------------------------------------------------------------


def test_reflection_lists_the_services(reward_server, rollout_server, learner_server):
    for running in (reward_server, rollout_server, learner_server):
        services = ProtoReflectionDescriptorDatabase(running.channel).get_services()
        assert running.service_name in services
        assert "grpc.health.v1.Health" in services
    assert {REWARD_SERVICE, ROLLOUT_SERVICE, LEARNER_SERVICE} == {
        "rlfleet.v1.Reward", "rlfleet.v1.Rollout", "rlfleet.v1.Learner"}


def test_get_status_reports_ready(reward_server, rollout_server, learner_server):
    stubs = {"reward": reward_pb2_grpc.RewardStub(reward_server.channel),
             "rollout": rollout_pb2_grpc.RolloutStub(rollout_server.channel),
             "learner": learner_pb2_grpc.LearnerStub(learner_server.channel)}
    for role, stub in stubs.items():
        status = stub.GetStatus(common_pb2.GetStatusRequest(), timeout=TIMEOUT)
        assert status.role == role
        assert status.ready, role
        assert status.in_flight == 0, role
        assert status.policy_version >= 0
