"""The rollout's agent loop on the embedded tiny model (real transformers engine) against real
environment servers: turns, observations through the chat template, the turn and token limits,
per-turn versions across a weight update, and failures that stay with their episodes."""
from __future__ import annotations

import threading

import pytest
import torch

from rlfleet.app.env_sdk import Environment, Message, Observation, Step, serve
from rlfleet.env.chat import ObservationRenderer
from rlfleet.models.tiny import ensure_tiny_model
from rlfleet.weights.naming import model_weights
from rlfleet.types import DataRow, PromptRequest, SamplingParams
from services.rollout.agent_loop import AgentLoop
from services.rollout.engines.hf import HFEngine
from services.rollout.env_client import EnvClient

pytestmark = pytest.mark.service
PARAMS = SamplingParams(n=2, temperature=1.0, max_new_tokens=6, seed=1)


@pytest.fixture(scope="module")
def engine() -> HFEngine:
    return HFEngine(ensure_tiny_model(), torch.device("cpu"), torch.float32)


def prompts(engine: HFEngine, digits=("4721", "905")) -> list[PromptRequest]:
    out = []
    for i, d in enumerate(digits):
        text = engine.tokenizer.apply_chat_template([{"role": "user", "content": f"Reverse the digits: {d}"}],
                                                    tokenize=False, add_generation_prompt=True)
        out.append(PromptRequest(f"p{i}", engine.tokenizer(text, add_special_tokens=False)["input_ids"],
                                 DataRow("digits_reverse", text, d[::-1])))
    return out


def run(engine, env, max_turns=3, max_episode_tokens=None, timeout_s=10.0):
    with serve(env, block=False) as server:
        client = EnvClient(server.address, timeout_s=timeout_s)
        loop = AgentLoop(engine, client, engine.tokenizer, max_turns, max_episode_tokens, engine.max_seq_len)
        groups = {g.request_id: g for g in loop.generate(prompts(engine), PARAMS)}
        client.close()
    return groups


def test_observations_are_rendered_by_the_chat_template(engine, tiny_tokenizer):
    chatml = ObservationRenderer(engine.tokenizer)
    tool = Observation(messages=(Message("tool", "42"),))
    # The model's eos <|im_end|> closed its turn; the template's "\n" after it is added here.
    assert chatml.text(tool, turn_ended_with_eos=True) == \
        "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"
    assert chatml.text(tool, turn_ended_with_eos=False).startswith("<|im_end|>\n<|im_start|>tool\n")
    assert chatml.text(Observation(text="raw"), True) == "raw"
    assert ObservationRenderer(tiny_tokenizer).text(tool, True) == "\n42\n"  # no chat template


class Echo(Environment):
    """Never done: repeats the request; ended episodes get reward 0.5."""

    def start(self, row):
        return {"row": row}

    def step(self, state, action):
        return Step(observation=[Message("user", state["row"].prompt.split("\n")[1])])

    def end(self, state, reason):
        return 0.5 if reason == "max_turns" else None


def test_max_turns_ends_episodes_with_the_environments_end_reward(engine):
    groups = run(engine, Echo(), max_turns=2)
    assert sorted(groups) == ["p0", "p1"]
    for g in groups.values():
        assert len(g.completions) == 2
        for c in g.completions:
            assert len(c.turns) == 2 and c.finish_reason == "max_turns" and c.env_reward == 0.5
            assert len(c.loss_mask) == len(c.token_ids) == len(c.logprobs)
            first = c.turns[0]
            # turn 1 | its observation | turn 2: the mask follows the layout exactly
            assert c.loss_mask == [1] * first.generated_tokens + [0] * first.observed_tokens + \
                [1] * c.turns[1].generated_tokens
            assert all(lp == 0.0 for lp, m in zip(c.logprobs, c.loss_mask) if m == 0)
            assert first.observation.endswith("<|im_start|>user\nReverse the digits: "
                                              f"{g.completions[0].turns[0].observation.split(': ')[1]}")


class OneAnswer(Environment):
    def start(self, row):
        return {}

    def step(self, state, action):
        return Step(reward=1.0, done=True)


def test_a_final_answer_cut_at_the_turn_limit_ends_the_episode_as_length(engine):
    with serve(OneAnswer(), block=False) as server:
        client = EnvClient(server.address)
        loop = AgentLoop(engine, client, engine.tokenizer, 3, None, engine.max_seq_len)
        short = SamplingParams(n=2, temperature=1.0, max_new_tokens=1, seed=1)  # no answer ends in 1 token
        groups = list(loop.generate(prompts(engine), short))
        client.close()
    for c in (c for g in groups for c in g.completions):
        assert c.turns[0].finish_reason == "length" and c.finish_reason == "length" and c.env_reward == 1.0


def test_token_budget_stops_an_episode_before_an_observation_that_does_not_fit(engine):
    groups = run(engine, Echo(), max_turns=5, max_episode_tokens=12)
    for c in (c for g in groups.values() for c in g.completions):
        assert c.finish_reason == "length" and len(c.token_ids) <= 12
        assert c.env_reward is None  # Echo gives no reward for an episode stopped by the budget


class NewWeightsAfterTurnOne(Environment):
    """Swaps in new weights (the same values, version 1) between the first and the second turn."""

    def __init__(self, engine):
        self.engine, self.lock = engine, threading.Lock()

    def start(self, row):
        return {"turns": 0}

    def step(self, state, action):
        state["turns"] += 1
        with self.lock:  # the episodes' steps run side by side on the server
            if self.engine.policy_version == 0:
                same = {name: t.detach().clone() for name, t in model_weights(self.engine.model)}
                self.engine.apply_weights(same, version=1)
        return Step(reward=1.0, done=True) if state["turns"] == 2 else Step(observation="again")


def test_each_turn_keeps_its_version_and_the_episode_its_oldest(engine):
    try:
        groups = run(engine, NewWeightsAfterTurnOne(engine))
    finally:
        engine.policy_version = 0
    for c in (c for g in groups.values() for c in g.completions):
        assert [t.policy_version for t in c.turns] == [0, 1]
        assert (c.policy_version, c.last_policy_version) == (0, 1)  # staleness counts from version 0


class Slow(Environment):
    """Its step answers only once `released` is set (after the episodes timed out)."""

    def __init__(self):
        self.released = threading.Event()

    def start(self, row):
        return {}

    def step(self, state, action):
        self.released.wait(60)
        return Step(done=True)


def test_a_slow_or_missing_environment_fails_episodes_not_the_rollout(engine):
    slow = Slow()
    try:  # 3 s: the start calls answer well within it on a loaded machine, the steps never do
        groups = run(engine, slow, timeout_s=3.0)
    finally:
        slow.released.set()
    for c in (c for g in groups.values() for c in g.completions):
        assert c.failed and c.env_failure == "timeout" and c.finish_reason == "failed"
        assert c.env_error.startswith("episode p")
        assert len(c.turns) == 1  # the turn was generated; its answer never came
    dead = EnvClient("127.0.0.1:1", timeout_s=2.0)
    loop = AgentLoop(engine, dead, engine.tokenizer, 3, None, engine.max_seq_len)
    groups = list(loop.generate(prompts(engine), PARAMS))
    assert [c.env_failure for g in groups for c in g.completions] == ["unavailable"] * 4
    dead.close()


class OneSlowTool(Environment):
    """Every episode ends at its first answer, but the first answer to prompt p0 waits for `released`
    (set by the test once every other episode is over) or gives up after `patience_s`."""

    def __init__(self, patience_s: float):
        self.released, self.patience_s = threading.Event(), patience_s
        self.waited_out = False

    def start(self, row):
        return {"slow": row.ground_truth == "1274"}  # prompt p0: "Reverse the digits: 4721"

    def step(self, state, action):
        if state.pop("slow", False):
            self.waited_out = not self.released.wait(self.patience_s)
            return Step(observation=[Message("tool", "42")])
        return Step(done=True)


def test_a_slow_tool_stalls_its_episode_not_the_batch(engine):
    """While p0's tool call is pending, the other prompts' episodes are answered, end, and come out of
    the loop; only then is p0's tool released. A loop that waits for every answer of a turn before
    going on never yields them while p0 waits, and p0's call gives up after `patience_s` instead."""
    env = OneSlowTool(patience_s=60.0)
    with serve(env, block=False) as server:
        client = EnvClient(server.address, timeout_s=120.0)
        loop = AgentLoop(engine, client, engine.tokenizer, 3, None, engine.max_seq_len)
        order = []
        for group in loop.generate(prompts(engine, ("4721", "905", "318")), PARAMS):
            order.append(group.request_id)
            if sorted(order) == ["p1", "p2"]:
                env.released.set()
        client.close()
    assert not env.waited_out, "the other episodes waited for the slow tool call (a batch-wide stall)"
    assert sorted(order[:2]) == ["p1", "p2"] and order[2] == "p0"
