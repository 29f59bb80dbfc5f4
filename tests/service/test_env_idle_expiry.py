"""The Python environment server expires episodes nobody ends (the contract asks servers to: End may
never come from a rollout that crashed): each is dropped and its environment's end(state, "expired")
frees what it holds; an episode a call named recently is kept."""
from __future__ import annotations

import pytest

from environments.servicer import EnvironmentServicer
from rlfleet.app.env_sdk import Environment, Step
from rlfleet.env.types import Action, EpisodeRow
from rlfleet.proto.v1 import environment_pb2_grpc
from rlfleet.rpc.server import ServiceServer
from services.rollout.env_client import EnvClient

pytestmark = pytest.mark.service


class Sandboxes(Environment):
    def __init__(self):
        self.freed: list[tuple[str, str]] = []

    def start(self, row):
        return {"id": row.ground_truth}

    def step(self, state, action):
        return Step(observation="go on")

    def end(self, state, reason):
        self.freed.append((state["id"], reason))
        return None


def test_idle_episodes_expire_and_free_what_they_hold():
    now = [0.0]
    env = Sandboxes()
    servicer = EnvironmentServicer(env, idle_expiry_s=60.0, clock=lambda: now[0])
    server = ServiceServer(["rlfleet.v1.Environment"], "127.0.0.1", 0)
    server.add(environment_pb2_grpc.add_EnvironmentServicer_to_server, servicer)
    server.start()
    server.mark_serving()
    client = EnvClient(server.address, timeout_s=10.0)
    try:
        client.start([EpisodeRow(episode_id=i, ground_truth=i) for i in ("orphan", "alive")])
        now[0] = 50.0
        [stepped], _ = client.step([Action(episode_id="alive", text="x")])  # named: idle again from 50 s
        assert stepped.ok
        now[0] = 70.0  # orphan idle 70 s > 60 s; alive 20 s
        [late], _ = client.step([Action(episode_id="orphan", text="x")])  # the call sweeps first
        assert not late.ok and "not running" in late.error
        assert env.freed == [("orphan", "expired")] and servicer.running() == 1
        now[0] = 200.0
        assert servicer.expire_idle() == ["alive"] and servicer.running() == 0
    finally:
        client.close()
        server.stop(grace_s=0)
