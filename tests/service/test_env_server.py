"""Environment servers made with the SDK, over real gRPC: the conformance check passes for every
built-in, an environment's exception fails its episode alone, and the rollout's client turns a slow,
dead or contract-breaking server into per-episode failures with their causes."""
from __future__ import annotations

import threading

import pytest

from environments.digits_game import DigitsGame
from rlfleet.app.env_check import FAIL, PASS, check_server
from rlfleet.app.env_sdk import Environment, Step, serve
from rlfleet.env.types import Action, EpisodeRow, StepResult
from services.rollout.env_client import EnvClient, check_reply

pytestmark = pytest.mark.service


@pytest.mark.parametrize("name", ["digits_game", "calculator", "python"])
def test_builtin_environments_pass_the_conformance_check(name):
    with serve(name, block=False) as server:
        checks = check_server(server.address, actions=['<tool name="calculator">6*7</tool>',
                                                       '<tool name="python">print(42)</tool>', "1274"])
    assert [c for c in checks if c.result == FAIL] == []
    # 20 PASS (the contract revision the built-in servers report among them); N/A: token refusal (no
    # token), NOT_SERVING on SIGTERM (no --stop)
    assert len(checks) == 22 and sum(c.result == PASS for c in checks) == 20, checks


class Fragile(Environment):
    """Its "slow" step answers only once `released` is set (after the test saw it time out)."""
    name = "fragile"

    def __init__(self):
        self.released = threading.Event()

    def start(self, row):
        if row.ground_truth == "bad":
            raise ValueError("cannot start from this row")
        return {}

    def step(self, state, action):
        if action.text == "crash":
            raise RuntimeError("the tool crashed")
        if action.text == "slow":
            self.released.wait(60)
        return Step(reward=1.0, done=True)


def test_exceptions_and_failures_stay_with_their_episode():
    fragile = Fragile()
    # 3 s: every call but the slow step answers well within it on a loaded machine
    with serve(fragile, block=False) as server:
        client = EnvClient(server.address, timeout_s=3.0)
        started, _ = client.start([EpisodeRow("a"), EpisodeRow("b", ground_truth="bad"), EpisodeRow("c"),
                                   EpisodeRow("d")])
        assert [r.ok for r in started] == [True, False, True, True]
        assert started[1].failure == "episode_error"
        assert "episode b" in started[1].error and "cannot start from this row" in started[1].error
        stepped, latency = client.step([Action("a", "crash"), Action("c", "fine")])
        assert (stepped[0].ok, stepped[0].failure) == (False, "episode_error")
        assert "episode a" in stepped[0].error and "the tool crashed" in stepped[0].error
        assert stepped[1].ok and stepped[1].done and stepped[1].reward == 1.0
        assert latency > 0
        slow, _ = client.step([Action("d", "slow")])  # past the 3 s deadline
        fragile.released.set()
        assert (slow[0].ok, slow[0].failure) == (False, "timeout") and "episode d" in slow[0].error
        client.close()
    client = EnvClient(server.address, timeout_s=1.0)  # the server is gone
    down, _ = client.start([EpisodeRow("e")])
    assert (down[0].ok, down[0].failure) == (False, "unavailable") and "episode e" in down[0].error
    client.close()


def test_replies_that_break_the_contract_fail_their_episodes():
    ok = StepResult(episode_id="x", done=True)
    assert [r.failure for r in check_reply(["x", "y"], [ok], "h:1")] == ["invalid_reply"] * 2
    swapped = check_reply(["x", "y"], [StepResult(episode_id="y"), StepResult(episode_id="x")], "h:1")
    assert [r.failure for r in swapped] == ["invalid_reply"] * 2 and "position 0" in swapped[0].error
    nan = check_reply(["x"], [StepResult(episode_id="x", reward=float("nan"))], "h:1")
    assert nan[0].failure == "invalid_reply" and "non-finite" in nan[0].error
    assert check_reply(["x"], [ok], "h:1") == [ok]


def test_digits_game_served_plays_to_a_reward():
    with serve(DigitsGame(), block=False) as server:
        client = EnvClient(server.address)
        client.start([EpisodeRow("g", ground_truth="321")])
        first, _ = client.step([Action("g", "123")])
        assert first[0].ok and not first[0].done
        assert first[0].observation.messages[0].content == "Reverse the digits: 123"
        second, _ = client.step([Action("g", "321")])
        assert second[0].done and second[0].reward == pytest.approx(0.75)
        client.close()
