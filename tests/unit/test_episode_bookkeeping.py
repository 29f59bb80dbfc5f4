"""Multi-turn bookkeeping with numbers derived by hand: the episode's token layout, loss mask,
logprobs and per-turn versions; the mask through the proto and into the learner's micro-batch; what
the controller scores and counts."""
from __future__ import annotations

import pytest
import torch

from controller.episodes import env_metrics, score_group
from controller.groups import ScoredGroup
from rlfleet.data.prompts import Prompt
from rlfleet.env.episode import Episode
from rlfleet.env.types import StepResult
from rlfleet.errors import InvalidRequest
from rlfleet.rpc import convert
from rlfleet.sample_checks import check_sample_shape
from rlfleet.types import Completion, ScoreResult, TrainBatch, TrainSample, TurnRecord
from services.learner.batching import collate

pytestmark = pytest.mark.unit


def two_turn_episode() -> Episode:
    """prompt [1 2 3] | opening obs [9] | turn 1 [10 11] (v3) | obs [20 21 22] | turn 2 [12] (v5..v6)."""
    e = Episode("r/0", [1, 2, 3], budget_tokens=20)
    e.add_observation([9], "<o>")
    e.add_turn([10, 11], [-0.5, -1.0], version=3, last_version=3, text="ab", finish_reason="stop",
               tool_calls=1)
    e.record_answer(StepResult("r/0", tool_errors=1), latency_s=0.25)
    e.add_observation([20, 21, 22], "<obs>")
    e.add_turn([12], [-0.25], version=5, last_version=6, text="c", finish_reason="stop")
    e.record_answer(StepResult("r/0", reward=0.75, done=True), latency_s=0.5)
    e.finish("stop")
    return e


def test_episode_layout_mask_logprobs_and_versions():
    e = two_turn_episode()
    c = e.completion()
    assert c.token_ids == [9, 10, 11, 20, 21, 22, 12]
    assert c.loss_mask == [0, 1, 1, 0, 0, 0, 1]
    assert c.logprobs == [0.0, -0.5, -1.0, 0.0, 0.0, 0.0, -0.25]
    # The staleness bound applies to the oldest token: turn 1's version 3; the newest is 6.
    assert (c.policy_version, c.last_policy_version) == (3, 6)
    assert c.opening_tokens == 1 and c.env_reward == 0.75 and c.finish_reason == "stop"
    assert c.text == "<o>ab<obs>c" and c.final_text == "c"
    assert c.turns == (
        TurnRecord(generated_tokens=2, observed_tokens=3, policy_version=3, last_policy_version=3,
                   tool_calls=1, tool_errors=1, env_latency_s=0.25, text="ab", observation="<obs>",
                   finish_reason="stop"),
        TurnRecord(generated_tokens=1, observed_tokens=0, policy_version=5, last_policy_version=6,
                   env_latency_s=0.5, text="c", reward=0.75, finish_reason="stop"))
    assert e.room == 20 - 7 and e.context_ids == [1, 2, 3, 9, 10, 11, 20, 21, 22, 12]


def test_completion_and_train_sample_keep_the_mask_through_the_protos():
    c = two_turn_episode().completion()
    assert convert.completion_from_proto(convert.completion_to_proto(c)) == c
    single = Completion([5, 6], [-0.5, -0.25], "stop", 2, "x")
    assert convert.completion_from_proto(convert.completion_to_proto(single)) == \
        Completion([5, 6], [-0.5, -0.25], "stop", 2, "x", last_policy_version=2)
    sample = TrainSample([1, 2, 3], c.token_ids, c.logprobs, 0.5, 3, loss_mask=c.loss_mask)
    batch = TrainBatch(step=1, samples=[sample], expected_version=3)
    assert convert.train_batch_from_proto(convert.train_batch_to_proto(batch)).samples == [sample]


def test_collate_trains_only_the_models_tokens():
    c = two_turn_episode().completion()
    sample = TrainSample([1, 2, 3], c.token_ids, c.logprobs, 1.0, 3, loss_mask=c.loss_mask)
    mb = collate([sample], pad_id=0, device=torch.device("cpu"))
    # P = 3: response token j is predicted from position P - 1 + j = 2 + j, so the mask
    # [0 1 1 0 0 0 1] lands on positions 2..8 of the 9 predictions (sequence of 10).
    assert mb.response_mask_B_T.tolist() == [[0, 0, 0, 1, 1, 0, 0, 0, 1]]
    assert mb.num_tokens == 3  # the model's tokens only
    assert mb.behaviour_logprobs_B_T.tolist() == [[0, 0, 0.0, -0.5, -1.0, 0, 0, 0, -0.25]]
    plain = collate([TrainSample([1, 2, 3], [4, 5], [-1.0, -2.0], 1.0, 0)], pad_id=0,
                    device=torch.device("cpu"))
    assert plain.response_mask_B_T.tolist() == [[0, 0, 1, 1]]


def test_a_mask_that_does_not_fit_is_refused():
    with pytest.raises(InvalidRequest, match="2 loss_mask entries for 3 response tokens"):
        check_sample_shape(0, TrainSample([1], [2, 3, 4], [0.0] * 3, 0.0, 0, loss_mask=[1, 0]))
    with pytest.raises(InvalidRequest, match="0 or 1"):
        check_sample_shape(0, TrainSample([1], [2], [0.0], 0.0, 0, loss_mask=[2]))


def prompt() -> Prompt:
    return Prompt(index=0, text="P", prompt_ids=[1], data_source="openai/gsm8k", ground_truth="42")


def test_only_episodes_without_an_environment_reward_go_to_the_reward_service():
    turn = TurnRecord(1, 0, 0, 0, text="#### 42")
    completions = [
        Completion([7], [-1.0], "stop", 0, "obs and #### 42", loss_mask=[1], turns=(turn,)),  # scored
        Completion([7], [-1.0], "stop", 0, "x", loss_mask=[1], turns=(turn,), env_reward=0.5),  # env's
        Completion([], [], "failed", 0, "", env_failure="timeout", env_error="episode r/2: late"),
    ]
    sent = []

    def score(items):
        sent.extend(items)
        return [ScoreResult(i.id, 1.0) for i in items]

    results = score_group(prompt(), completions, "r", score)
    assert [i.response for i in sent] == ["#### 42"]  # the final turn, not the whole text
    assert [(r.id, r.score, r.ok) for r in results] == [("r/0", 1.0, True), ("r/1", 0.5, True),
                                                        ("r/2", 0.0, False)]
    assert results[2].error == "environment: timeout: episode r/2: late"
    assert ScoredGroup(0, prompt(), completions, results).scored() == [(completions[0], 1.0),
                                                                      (completions[1], 0.5)]
    nothing = []
    score_group(prompt(), completions[1:], "r", lambda items: nothing.append(items) or [])
    assert nothing == []  # no call at all when the environment gave every reward


def test_env_metrics_by_hand():
    a = two_turn_episode().completion()  # 2 turns, 1 tool call, 1 error, latency 0.25 + 0.5, 3 gen, 4 obs
    b = Completion([5], [-0.1], "max_turns", 1, "z", loss_mask=[1],
                   turns=(TurnRecord(1, 0, 1, 1, tool_calls=2, env_latency_s=0.25),))
    failed = Completion([], [], "failed", 0, "", env_failure="unavailable", env_error="down")
    m = env_metrics([a, b, failed])
    assert m["env/episodes"] == 3
    assert m["env/turns_mean"] == pytest.approx(3 / 3)  # 2 + 1 turns over 3 episodes
    assert m["env/tool_calls"] == 3 and m["env/tool_errors"] == 1
    assert m["env/latency_s_mean"] == pytest.approx((0.25 + 0.5 + 0.25) / 3)
    assert (m["env/generated_tokens"], m["env/observed_tokens"]) == (4, 4)
    assert m["env/failed"] == 1 and m["env/failed/unavailable"] == 1 and m["env/failed/timeout"] == 0
    assert (m["env/finish/stop"], m["env/finish/max_turns"]) == (1, 1)
    assert env_metrics([Completion([5], [-0.1], "stop", 0)]) == {}  # single-turn runs have none


def test_overlong_penalty_judges_an_episodes_final_turn():
    from controller.sample_builder import shaped_length

    # The episode holds 7 tokens, but its final turn generated 1: the penalty (rollout.max_new_tokens
    # bounds one turn) looks at that turn; a single-turn response is judged whole.
    assert shaped_length(two_turn_episode().completion()) == 1
    assert shaped_length(Completion([1, 2, 3], [0.0] * 3, "length", 0)) == 3
