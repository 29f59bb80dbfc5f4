"""The agent loop's side of the environment contract's decided points (issue 32), against real servers
on the embedded tiny model: episodes of a failed call are ended (reason `failed`), episodes the rollout
abandons are ended (`aborted`), an opening observation is a user turn before the first assistant
turn, episode ids are never reused across rollout processes, and the environment's metrics travel
with the episode."""
from __future__ import annotations

import time

import pytest
import torch

from controller.groups import ScoredGroup
from rlfleet.app.env_sdk import Environment, Step, serve
from rlfleet.data.prompts import Prompt
from rlfleet.models.tiny import ensure_tiny_model
from rlfleet.types import ScoreResult
from services.rollout.agent_loop import AgentLoop
from services.rollout.engines.hf import HFEngine
from services.rollout.env_client import EnvClient
from tests.env_servers import start as start_faulty
from tests.service.test_agent_loop import PARAMS, prompts

pytestmark = pytest.mark.service


@pytest.fixture(scope="module")
def engine() -> HFEngine:
    return HFEngine(ensure_tiny_model(), torch.device("cpu"), torch.float32)


def wait_for(condition, what: str, bound_s: float = 30.0) -> None:
    """A bound for a stalled machine, not a tuning: the condition is an event the code under test causes."""
    deadline = time.monotonic() + bound_s
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)


def test_episodes_of_a_failed_call_are_ended_with_reason_failed(engine):
    server, env = start_faulty("nan_reward")
    client = EnvClient(server.address, timeout_s=10.0)
    try:
        loop = AgentLoop(engine, client, engine.tokenizer, 3, None, engine.max_seq_len)
        completions = [c for g in loop.generate(prompts(engine), PARAMS) for c in g.completions]
        assert [c.env_failure for c in completions] == ["invalid_reply"] * 4
        stepped = {i for rpc, ids, _ in env.calls if rpc == "Step" for i in ids}
        # Best effort and off the generation path: the End may land after the groups came back.
        wait_for(lambda: {i for rpc, ids, _ in env.calls if rpc == "End" for i in ids} == stepped,
                 "an End for each episode of the failed Step")
        assert {reason for rpc, _, reason in env.calls if rpc == "End"} == {"failed"}
    finally:
        client.close()
        server.stop(grace_s=0)


class DoneForTheFirstPrompt(Environment):
    """p0's episodes end at their first turn; p1's never end by themselves."""

    def __init__(self):
        self.ended: dict[str, str] = {}

    def start(self, row):
        return {"quick": row.ground_truth == "1274"}

    def step(self, state, action):
        return Step(reward=1.0, done=True) if state["quick"] else Step(observation="again")

    def end(self, state, reason):
        self.ended[reason] = self.ended.get(reason, 0) + 1
        return None


def test_episodes_the_rollout_abandons_are_ended_with_reason_aborted(engine):
    env = DoneForTheFirstPrompt()
    with serve(env, block=False) as server:
        client = EnvClient(server.address, timeout_s=10.0)
        loop = AgentLoop(engine, client, engine.tokenizer, 4, None, engine.max_seq_len)
        stream = loop.generate(prompts(engine), PARAMS)
        first = next(stream)
        assert first.request_id == "p0"
        stream.close()  # the caller cancelled the request (a Generate stream cut)
        wait_for(lambda: env.ended.get("aborted") == 2, "an End(aborted) for p1's two episodes")
        assert server.servicer.running() == 0
        client.close()


class Opening(Environment):
    def start(self, row):
        return {}

    def opening(self, state):
        return "You have two tries."

    def step(self, state, action):
        return Step(reward=1.0, done=True, metrics={"tries": 1.0, "digits_right": 0.5})


def test_an_opening_observation_is_a_user_turn_before_the_first_assistant_turn(engine):
    with serve(Opening(), block=False) as server:
        client = EnvClient(server.address, timeout_s=10.0)
        loop = AgentLoop(engine, client, engine.tokenizer, 2, None, engine.max_seq_len)
        requests = prompts(engine)
        groups = {g.request_id: g for g in loop.generate(requests, PARAMS)}
        client.close()
    request = requests[0]
    c = groups["p0"].completions[0]
    generation_prompt = "<|im_start|>assistant\n"
    assert engine.tokenizer.decode(request.prompt_ids).endswith(generation_prompt)
    # The episode's context replaces the prompt's generation prompt: the opening comes first as a
    # user turn, then the generation prompt again, then the model's turn.
    assert c.prompt_trim == len(engine.tokenizer(generation_prompt, add_special_tokens=False)["input_ids"])
    context = engine.tokenizer.decode(request.prompt_ids[:-c.prompt_trim] + c.token_ids[:c.opening_tokens])
    assert context.endswith("Reverse the digits: 4721<|im_end|>\n<|im_start|>user\nYou have two tries."
                            "<|im_end|>\n<|im_start|>assistant\n"), context
    assert "<|im_start|>assistant\n<|im_start|>" not in context
    # What the learner trains on is that same context: the prompt less its trim, then the response.
    prompt = Prompt(index=0, prompt_ids=request.prompt_ids, text=request.row.prompt,
                    data_source="digits_reverse", ground_truth="1274")
    group = ScoredGroup(0, prompt, groups["p0"].completions,
                        [ScoreResult(f"p0/{i}", 1.0) for i in range(2)])
    sample = group.train_samples()[0]
    assert sample.prompt_ids == request.prompt_ids[:-c.prompt_trim] and sample.response_ids == c.token_ids
    # StepResult.metrics travel with the episode (averaged into env/<name> by the controller).
    assert c.env_metrics == {"tries": 1.0, "digits_right": 0.5}


def test_episode_ids_differ_between_two_rollout_processes(engine):
    ids = []
    for _ in range(2):
        server, env = start_faulty("honest")
        client = EnvClient(server.address, timeout_s=10.0)
        try:
            loop = AgentLoop(engine, client, engine.tokenizer, 1, None, engine.max_seq_len)
            list(loop.generate(prompts(engine), PARAMS))
            ids.append({i for rpc, batch, _ in env.calls if rpc == "Start" for i in batch})
        finally:
            client.close()
            server.stop(grace_s=0)
    assert len(ids[0]) == len(ids[1]) == 4 and not ids[0] & ids[1]
    assert all(i.startswith(("p0/", "p1/")) for i in ids[0])  # <request>/<sample>:<tag>


def test_an_opening_that_cannot_replace_the_generation_prompt_is_appended_as_it_is(engine, tiny_tokenizer):
    from rlfleet.env.chat import ObservationRenderer
    from rlfleet.env.types import Message, Observation

    chatml = ObservationRenderer(engine.tokenizer)
    user = Observation(messages=(Message("user", "You have two tries."),))
    prompt = engine.tokenizer("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
                              add_special_tokens=False)["input_ids"]
    trim, text = chatml.opening(user, prompt)
    assert trim == 3 and text == "<|im_start|>user\nYou have two tries.<|im_end|>\n<|im_start|>assistant\n"
    # raw text: the server owns the format, appended right after the prompt
    assert chatml.opening(Observation(text="Go."), prompt) == (0, "Go.")
    # a plain-string prompt (no generation prompt at its end): nothing to replace
    plain = engine.tokenizer("Reverse 12:", add_special_tokens=False)["input_ids"]
    assert chatml.opening(user, plain)[0] == 0
    # a tokenizer without a chat template: the contents on lines of their own
    assert ObservationRenderer(tiny_tokenizer).opening(user, plain) == (0, "\nYou have two tries.\n")
