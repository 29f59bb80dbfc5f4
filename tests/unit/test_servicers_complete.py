"""The generated `*_pb2_grpc.py` servicer bases answer every RPC with NotImplementedError (grpcio-tools
writes them so); each of our servicers must override every one of its service's RPCs, so none of
those bodies can ever be reached by a client."""
from __future__ import annotations

import inspect

import pytest

from controller.status_servicer import ControllerServicer
from environments.servicer import EnvironmentServicer
from rlfleet.proto.v1 import (controller_pb2_grpc, environment_pb2_grpc, learner_pb2_grpc, reward_pb2_grpc,
                              rollout_pb2_grpc)
from services.learner.servicer import LearnerServicer
from services.reward.servicer import RewardServicer
from services.rollout.servicer import RolloutServicer

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("ours, generated", [
    (RolloutServicer, rollout_pb2_grpc.RolloutServicer),
    (RewardServicer, reward_pb2_grpc.RewardServicer),
    (LearnerServicer, learner_pb2_grpc.LearnerServicer),
    (ControllerServicer, controller_pb2_grpc.ControllerServicer),
    (EnvironmentServicer, environment_pb2_grpc.EnvironmentServicer),
])
def test_every_rpc_is_implemented(ours, generated):
    rpcs = [name for name, _ in inspect.getmembers(generated, inspect.isfunction) if not name.startswith("_")]
    assert rpcs  # the generated base really lists the service's RPCs
    unimplemented = [name for name in rpcs if getattr(ours, name) is getattr(generated, name)]
    assert unimplemented == [], \
        f"{ours.__name__} leaves {unimplemented} to the generated NotImplementedError stub"
