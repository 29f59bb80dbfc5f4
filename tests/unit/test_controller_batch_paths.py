"""The controller's per-batch paths of issue 44 (each per-sample object made once, and made without a
frozen dataclass's __init__): what they produce must not change. Each expected message is built here
field by field, by the plain protobuf constructors, and compared byte for byte."""
from __future__ import annotations

import dataclasses
import math

import pytest

from controller.groups import ScoredGroup
from controller.sample_builder import SampleBuilder
from controller.step_metrics import step_metrics
from rlfleet import types as t
from rlfleet.algorithm import AlgorithmConfig
from rlfleet.data.prompts import Prompt
from rlfleet.proto.v1 import learner_pb2, reward_pb2
from rlfleet.rpc import convert

pytestmark = pytest.mark.unit


def test_an_assembled_instance_equals_one_made_by_its_constructor_and_stays_frozen():
    ref = t.PayloadRef("h:1", "r", 2, 30)
    made = t.Completion([1], [-0.5], "stop", 3, text="x", payload=ref)
    assembled = t.assemble(t.Completion, {f.name: getattr(made, f.name) for f in dataclasses.fields(made)})
    assert assembled == made and assembled.response_tokens == 30
    assert set(vars(assembled)) == {f.name for f in dataclasses.fields(made)}  # every field its own
    with pytest.raises(dataclasses.FrozenInstanceError):
        assembled.text = "y"


def test_assemble_refuses_a_missing_or_unknown_field():
    with pytest.raises(TypeError, match="score"):
        t.assemble(t.ScoreResult, {"id": "a", "ok": True, "error": "", "components": {}})
    with pytest.raises(TypeError, match="extra"):
        t.assemble(t.ScoreResult, {"id": "a", "score": 1.0, "ok": True, "error": "", "components": {},
                                   "extra": 1})


def test_a_received_episode_keeps_every_field():
    turns = (t.TurnRecord(4, 3, 2, 3, text="call", reward=0.0), t.TurnRecord(2, 0, 3, 3, text="done"))
    sent = t.Completion([7, 8, 9], [-0.1, 0.0, -0.3], "length", 2, text="call done", last_policy_version=3,
                        loss_mask=[1, 0, 1], turns=turns, env_reward=0.0, env_failure="timeout",
                        env_error="slow", opening_tokens=5, prompt_trim=2, env_metrics={"steps": 2.0})
    got = convert.completion_from_proto(convert.completion_to_proto(sent))
    assert dataclasses.replace(got, token_ids=list(got.token_ids), logprobs=list(got.logprobs)) == \
        dataclasses.replace(sent, logprobs=pytest.approx(sent.logprobs))


def _flight(prompt: list[int], rid: str, i: int, advantage: float, version: int = 3) -> t.TrainSample:
    return t.TrainSample(prompt, [], [], advantage, version, reward=advantage / 2,
                         payload=t.PayloadRef("10.0.0.1:7000", rid, i, 100 + i))


def test_a_train_request_is_the_one_built_sample_by_sample():
    shared_a, shared_b = [1, 2, 3], [4, 5]
    samples = [_flight(shared_a, "r-1", 0, 0.5), _flight(shared_a, "r-1", 1, -0.5, version=2),
               _flight(shared_b, "r-2", 0, 0.0),
               _flight([4, 5], "r-2", 3, 1.25),  # equal ids, not the same list
               t.TrainSample([6], [10, 11], [-0.25, -0.75], 2.0, 4, reward=1.0, loss_mask=[1, 0]),
               t.TrainSample([6], [12], [-1.0], -2.0, 4),
               t.TrainSample(shared_a, [], [], 0.5, 3, payload=t.PayloadRef("10.0.0.2:7000", "r-1", 4))]
    expected = learner_pb2.TrainRequest(step=7, temperature=0.7, expected_version=6)
    for s in samples:
        entry = learner_pb2.TrainSample(prompt_ids=s.prompt_ids, response_ids=s.response_ids,
                                        behaviour_logprobs=s.behaviour_logprobs, advantage=s.advantage,
                                        generation_version=s.generation_version, reward=s.reward,
                                        loss_mask=s.loss_mask or [])
        if s.payload is not None:
            entry.payload.CopyFrom(learner_pb2.PayloadRef(address=s.payload.address,
                                                          request_id=s.payload.request_id,
                                                          sample=s.payload.sample))
        expected.samples.append(entry)
    got = convert.train_batch_to_proto(t.TrainBatch(7, samples, temperature=0.7, expected_version=6))
    assert got.SerializeToString() == expected.SerializeToString()
    # the sample of index 0 of a group still says where its tokens are (a present, all-default field)
    assert got.samples[2].HasField("payload") and got.samples[2].payload.sample == 0


def test_a_score_request_is_the_one_built_item_by_item():
    extra = {"answer": 5}
    items = [t.ScoreItem(f"r/{i}", "gsm8k", "prompt one", f"response {i}", "5", extra, "stop")
             for i in range(3)]
    items += [t.ScoreItem("s/0", "gsm8k", "prompt two", "other", "7", {}, "length"),
              t.ScoreItem("s/1", "math", "prompt two", "again", "7", {}, "")]
    expected = reward_pb2.ScoreRequest(items=[
        reward_pb2.ScoreItem(id=i.id, data_source=i.data_source, prompt=i.prompt, response=i.response,
                             ground_truth=i.ground_truth,
                             extra_info_json='{"answer": 5}' if i.extra_info else "",
                             finish_reason=i.finish_reason) for i in items])
    assert convert.score_items_to_proto(items).SerializeToString() == expected.SerializeToString()


def _scored_group(seq: int, scores: list[float], lengths: list[int]) -> ScoredGroup:
    prompt = Prompt(seq, "p", [1, 2], "src", "gt")
    completions = [t.Completion([5] * n, [-0.5] * n, "length" if n >= 8 else "stop", 3 - i % 2)
                   for i, n in enumerate(lengths)]
    results = [t.ScoreResult(f"r/{i}", s) for i, s in enumerate(scores)]
    return ScoredGroup(seq, prompt, completions, results)


def test_the_batch_pass_builds_the_samples_and_metrics_derived_by_hand():
    # max_new_tokens 8, buffer 0.5 * 8 = 4 tokens from 4; penalty 1: length 6 -> -(6 - 4) / 4 = -0.5,
    # length 8 -> -1, lengths <= 4 -> 0. Group 0: scores 1, 0 (lengths 2, 6) -> shaped 1, -0.5;
    # mean 0.25, centred 0.75, -0.75, unbiased std sqrt(2 * 0.5625) = 1.0607 -> advantages +-0.7071.
    # Group 1: scores 0.5, 0.5 (lengths 8, 3) -> shaped -0.5, 0.5 -> advantages +-0.7071 again.
    builder = SampleBuilder(AlgorithmConfig(overlong_buffer_ratio=0.5, overlong_penalty=1.0), 8)
    groups = [_scored_group(0, [1.0, 0.0], [2, 6]), _scored_group(1, [0.5, 0.5], [8, 3])]
    samples, metrics = builder.build(groups)
    assert [s.reward for s in samples] == [1.0, -0.5, -0.5, 0.5]
    assert [s.advantage for s in samples] == pytest.approx([0.7071, -0.7071, -0.7071, 0.7071], abs=1e-4)
    assert [s.generation_version for s in samples] == [3, 2, 3, 2]
    assert metrics["reward/shaped_mean"] == 0.125  # (1 - 0.5 - 0.5 + 0.5) / 4
    assert metrics["reward/overlong_penalty_mean"] == -0.375  # (0 - 0.5 - 1 + 0) / 4
    assert metrics["groups/trained"] == 2.0 and metrics["groups/no_signal"] == 0.0
    m = step_metrics(1, 4, groups, samples, {}, dropped={}, wait_s=0.0, train_s=1.0, sync_s=0.0,
                     step_s=2.0)
    # rewards 1, 0, 0.5, 0.5: mean 0.5, population std sqrt((0.25 + 0.25) / 4) = 0.35355
    assert m["reward/mean"] == 0.5 and m["reward/std"] == pytest.approx(0.353553, abs=1e-6)
    assert m["response_length/mean"] == 4.75 and m["response_length/clip_ratio"] == 0.25  # one of 8
    assert m["staleness/mean"] == 2.0 and m["staleness/max"] == 2.0  # each group's oldest is 2; trained at 4
    assert m["perf/tokens_per_s"] == (4 * 2 + 19) / 2.0


def test_a_negative_zero_score_trains_as_zero_without_a_buffer():
    builder = SampleBuilder(AlgorithmConfig(overlong_buffer_ratio=0.0), 8)
    samples, _ = builder.build([_scored_group(0, [-0.0, 1.0], [2, 3])])
    assert math.copysign(1.0, samples[0].reward) == 1.0
