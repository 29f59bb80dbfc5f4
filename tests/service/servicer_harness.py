"""Shared harness for the servicer tests: in-process gRPC servers per role and call helpers.

Servers bind 127.0.0.1 port 0 (the OS picks the port) and are stopped in teardown.
The rollout and learner load the session's tiny random model (tests/conftest.py).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlfleet.config import LearnerConfig
from rlfleet.proto.v1 import (
    common_pb2,
    learner_pb2,
    learner_pb2_grpc,
    reward_pb2,
    reward_pb2_grpc,
    rollout_pb2,
    rollout_pb2_grpc,
)
from rlfleet.rpc.channel import open_channel
from rlfleet.rpc.server import ServiceServer
from services.learner.learner import Learner
from services.learner.servicer import SERVICE_NAME as LEARNER_SERVICE
from services.learner.servicer import LearnerServicer
from services.reward.servicer import SERVICE_NAME as REWARD_SERVICE
from services.reward.servicer import RewardServicer
from services.rollout.servicer import SERVICE_NAME as ROLLOUT_SERVICE
from services.rollout.servicer import RolloutServicer

TIMEOUT = 30  # seconds, per RPC
CPU = torch.device("cpu")


@dataclass
class Running:
    server: ServiceServer
    channel: grpc.Channel
    servicer: object
    service_name: str

    def health(self, service: str = "") -> int:
        return health_pb2_grpc.HealthStub(self.channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT).status


@dataclass(frozen=True)
class Role:
    servicer_cls: type
    add_fn: Callable
    stub_cls: type
    service_name: str


ROLES = {
    "reward": Role(RewardServicer, reward_pb2_grpc.add_RewardServicer_to_server, reward_pb2_grpc.RewardStub,
                   REWARD_SERVICE),
    "rollout": Role(RolloutServicer, rollout_pb2_grpc.add_RolloutServicer_to_server,
                    rollout_pb2_grpc.RolloutStub, ROLLOUT_SERVICE),
    "learner": Role(LearnerServicer, learner_pb2_grpc.add_LearnerServicer_to_server,
                    learner_pb2_grpc.LearnerStub, LEARNER_SERVICE),
}


def start(role: str) -> Running:
    """Starts an unattached servicer: listening, but NOT_SERVING."""
    spec = ROLES[role]
    servicer = spec.servicer_cls()
    server = ServiceServer([spec.service_name], "127.0.0.1", 0, max_workers=4)
    server.add(spec.add_fn, servicer)
    server.start()
    return Running(server, open_channel(server.address), servicer, spec.service_name)


def stop(running: Running) -> None:
    running.channel.close()
    running.server.stop(grace_s=0)


def code_of(call: Callable[[], object]) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        result = call()
        if isinstance(result, Iterator):
            list(result)
    return info.value.code()


def details_of(call: Callable[[], object]) -> str:
    with pytest.raises(grpc.RpcError) as info:
        result = call()
        if isinstance(result, Iterator):
            list(result)
    return info.value.details()


# ---- cores, loaded once per module ---------------------------------------------------------------


def make_learner(tiny_model_dir: Path, cfg: LearnerConfig, checkpoint_dir: Path) -> Learner:
    return Learner(cfg, tiny_model_dir, CPU, torch.float32, checkpoint_dir, seed=0)


def attach(role: str, running: Running, core: object) -> None:
    if role == "rollout":
        running.servicer.attach(core)
    else:
        running.servicer.attach(core)
    running.server.mark_serving()


def call_before_attach(role: str, stub: object) -> Callable[[], object]:
    if role == "reward":
        return lambda: stub.Score(reward_pb2.ScoreRequest(items=[reward_pb2.ScoreItem(id="a")]),
                                  timeout=TIMEOUT)
    if role == "rollout":
        return lambda: stub.Generate(rollout_pb2.GenerateRequest(
            prompts=[rollout_pb2.PromptInput(request_id="a", prompt_ids=[5, 6])],
            params=common_pb2.SamplingParams(n=2, max_new_tokens=2)), timeout=TIMEOUT)
    return lambda: stub.Train(learner_pb2.TrainRequest(step=1, expected_version=-1, samples=[
        learner_pb2.TrainSample(prompt_ids=[5], response_ids=[6], behaviour_logprobs=[-1.0])]),
        timeout=TIMEOUT)


def generate(stub, prompts: dict[str, list[int]], **params) -> list[rollout_pb2.GroupResult]:
    request = rollout_pb2.GenerateRequest(
        prompts=[rollout_pb2.PromptInput(request_id=rid, prompt_ids=ids) for rid, ids in prompts.items()],
        params=common_pb2.SamplingParams(**params))
    return list(stub.Generate(request, timeout=TIMEOUT))


PROMPTS = {"p0": [6, 7, 41, 8, 45], "p1": [15, 16], "p2": [9, 10, 11, 12, 13, 14, 20]}
