"""Scored groups (failures excluded, group advantages, version) and the per-step metrics line."""
from __future__ import annotations

import math

import pytest

from controller.groups import ScoredGroup, score_items
from controller.step_metrics import step_metrics
from rlfleet.data.prompts import Prompt
from rlfleet.types import Completion, ScoreResult

pytestmark = pytest.mark.unit

PROMPT = Prompt(index=4, text="1+1=", prompt_ids=[7, 8, 9], data_source="digits", ground_truth="2",
                extra_info={"k": 1})


def completion(tokens: list[int], version: int = 0, finish: str = "stop", text: str = "") -> Completion:
    return Completion(token_ids=tokens, logprobs=[-0.5] * len(tokens), finish_reason=finish,
                      policy_version=version, text=text)


def ok(score: float, i: int = 0) -> ScoreResult:
    return ScoreResult(id=f"r/{i}", score=score)


def failed(i: int = 0) -> ScoreResult:
    return ScoreResult(id=f"r/{i}", score=0.0, ok=False, error="ValueError: boom")


def test_failed_rewards_are_excluded_not_scored_zero():
    comps = [completion([1]), completion([2]), completion([3]), completion([4])]
    group = ScoredGroup(seq=0, prompt=PROMPT, completions=comps,
                        results=[ok(1.0), ok(0.0), failed(), ok(1.0)])
    assert group.failed == 1
    assert [(c.token_ids, s) for c, s in group.scored()] == [([1], 1.0), ([2], 0.0), ([4], 1.0)]
    samples = group.train_samples()
    # Rewards [1, 0, 1]: mean 2/3, unbiased std sqrt(((1/3)^2 + (2/3)^2 + (1/3)^2) / 2) = sqrt(1/3),
    # so advantages (1/3)/sqrt(1/3) = 0.57735 and (-2/3)/sqrt(1/3) = -1.15470.
    assert [s.response_ids for s in samples] == [[1], [2], [4]]
    assert [s.advantage for s in samples] == pytest.approx([0.57735, -1.15470, 0.57735], abs=1e-4)
    assert all(s.prompt_ids == [7, 8, 9] for s in samples)
    assert all(s.behaviour_logprobs == [-0.5] for s in samples)
    # Had the failure been scored 0, the zero-reward sample's advantage would differ.
    as_zero = ScoredGroup(0, PROMPT, comps, [ok(1.0), ok(0.0), ok(0.0), ok(1.0)]).train_samples()
    assert as_zero[1].advantage != pytest.approx(samples[1].advantage, abs=1e-3)


def test_group_advantages_sum_to_zero_and_equal_rewards_give_zero():
    group = ScoredGroup(0, PROMPT, [completion([1]), completion([2]), completion([3])],
                        [ok(0.2), ok(0.5), ok(0.8)])
    advs = [s.advantage for s in group.train_samples()]
    assert sum(advs) == pytest.approx(0.0, abs=1e-6)
    # [0.2, 0.5, 0.8]: centred [-0.3, 0, 0.3], unbiased std 0.3 -> [-1, 0, 1].
    assert advs == pytest.approx([-1.0, 0.0, 1.0], abs=1e-4)
    flat = ScoredGroup(0, PROMPT, [completion([1]), completion([2])], [ok(1.0), ok(1.0)])
    assert [s.advantage for s in flat.train_samples()] == [0.0, 0.0]


def test_all_failed_group_has_no_samples():
    group = ScoredGroup(0, PROMPT, [completion([1]), completion([2])], [failed(0), failed(1)])
    assert group.failed == 2
    assert group.scored() == []
    assert group.train_samples() == []


def test_empty_completions_are_not_trained():
    group = ScoredGroup(0, PROMPT, [completion([]), completion([5]), completion([6])],
                        [ok(1.0), ok(0.0), ok(1.0)])
    samples = group.train_samples()
    assert [s.response_ids for s in samples] == [[5], [6]]


def test_version_is_the_oldest_completion_version():
    group = ScoredGroup(0, PROMPT, [completion([1], 5), completion([2], 3), completion([3], 4)],
                        [ok(0.0), ok(1.0), ok(0.0)])
    assert group.version == 3
    assert [s.generation_version for s in group.train_samples()] == [5, 3, 4]


def test_score_items_carry_prompt_and_completion():
    items = score_items(PROMPT, [completion([1], text="2"), completion([2], text="3")], "p4-s0")
    assert [i.id for i in items] == ["p4-s0/0", "p4-s0/1"]
    assert [i.response for i in items] == ["2", "3"]
    assert all(i.prompt == "1+1=" and i.ground_truth == "2" and i.data_source == "digits" for i in items)
    assert items[0].extra_info == {"k": 1}


REQUIRED_KEYS = ["step", "policy_version", "reward/mean", "reward/std", "actor/pg_loss", "actor/kl_loss",
                 "actor/entropy", "staleness/mean", "staleness/max", "timing/weight_sync_s",
                 "perf/tokens_per_s"]


def test_step_metrics_keys_and_hand_checked_values():
    # Train version 3. Group A: versions [3, 2] -> version 2, staleness 1; rewards [1.0, failed].
    # Group B: versions [3, 3] -> staleness 0; rewards [0.0, 0.5].
    a = ScoredGroup(0, PROMPT, [completion([1, 2], 3), completion([3], 2, "length")], [ok(1.0), failed()])
    b = ScoredGroup(1, PROMPT, [completion([4], 3), completion([5, 6, 7], 3)], [ok(0.0), ok(0.5)])
    samples = a.train_samples() + b.train_samples()
    learner = {"actor/pg_loss": 0.25, "actor/entropy": 1.5, "actor/grad_norm": 0.7, "learner/tokens": 6.0}
    m = step_metrics(7, 3, [a, b], samples, learner, dropped={"stale": 1, "unusable": 2, "filtered": 3},
                     wait_s=0.1, train_s=0.2, sync_s=0.3,
                     step_s=2.0)
    for key in REQUIRED_KEYS:
        assert key in m, key
    assert m["step"] == 7 and m["policy_version"] == 3
    # Rewards obtained: 1.0, 0.0, 0.5 (the failure is not a 0): mean 0.5,
    # population std sqrt((0.25 + 0.25 + 0) / 3) = 0.408248.
    assert m["reward/mean"] == pytest.approx(0.5)
    assert m["reward/std"] == pytest.approx(math.sqrt(1 / 6))
    assert m["reward/failed"] == 1.0
    assert m["staleness/mean"] == pytest.approx(0.5)
    assert m["staleness/max"] == 1.0
    assert m["staleness/dropped_groups"] == 3.0  # the gate's drops: stale and unusable (not filtered)
    assert (m["dropped_groups/stale"], m["dropped_groups/unusable"],
            m["dropped_groups/filtered"]) == (1.0, 2.0, 3.0)
    assert m["actor/pg_loss"] == 0.25 and m["actor/entropy"] == 1.5
    assert m["actor/kl_loss"] == 0.0  # absent from the learner: reported as 0, not missing
    assert m["timing/weight_sync_s"] == 0.3
    # Samples: group A keeps 1 (tokens 3 + 2 = 5), group B 2 (3 + 1 and 3 + 3 = 10): 15 tokens / 2 s.
    assert len(samples) == 3
    assert m["perf/tokens_per_s"] == pytest.approx(7.5)
    assert m["perf/samples_per_s"] == pytest.approx(1.5)
    # Lengths 2, 1, 1, 3 -> mean 1.75; one of four truncated.
    assert m["response_length/mean"] == pytest.approx(1.75)
    assert m["response_length/clip_ratio"] == pytest.approx(0.25)
    assert m["learner/tokens"] == 6.0  # extra learner metrics pass through
    assert all(isinstance(v, (int, float)) for v in m.values())


def test_step_metrics_with_no_rewards_or_time():
    group = ScoredGroup(0, PROMPT, [completion([1], 2)], [failed()])
    m = step_metrics(1, 2, [group], [], {}, dropped={}, wait_s=0.0, train_s=0.0, sync_s=0.0, step_s=0.0)
    for key in REQUIRED_KEYS:
        assert key in m, key
    assert m["reward/mean"] == 0.0 and m["reward/std"] == 0.0
    assert all(m[f"dropped_groups/{r}"] == 0.0 for r in ("stale", "unusable", "filtered"))  # always logged
    assert m["perf/tokens_per_s"] == 0.0
    assert m["staleness/max"] == 0.0


def test_train_samples_hold_every_field_as_the_constructor_makes_it():
    """Made without the frozen __init__ (issue 44): each field its own, the same values, still frozen."""
    import dataclasses

    from rlfleet.types import PayloadRef, TrainSample

    trimmed = Completion([], [], "stop", 2, prompt_trim=1, loss_mask=[1, 0],
                         payload=PayloadRef("h:1", "r", 1, 5))
    group = ScoredGroup(0, PROMPT, [completion([1, 2], version=3), trimmed, completion([])],
                        [ok(1.0), ok(0.0), ok(0.5)])
    samples = group.train_samples(rewards=[1.0, 0, 0.5])
    assert samples == [TrainSample([7, 8, 9], [1, 2], [-0.5, -0.5], samples[0].advantage, 3, reward=1.0),
                       TrainSample([7, 8], [], [], samples[1].advantage, 2, reward=0.0, loss_mask=[1, 0],
                                   payload=PayloadRef("h:1", "r", 1, 5))]
    assert samples[0].prompt_ids is PROMPT.prompt_ids  # untrimmed: the prompt's own list, not a copy
    assert [type(s.reward) for s in samples] == [float, float]  # the int 0 made a float
    for s in samples:
        assert set(vars(s)) == {f.name for f in dataclasses.fields(TrainSample)}
        with pytest.raises(dataclasses.FrozenInstanceError):
            s.reward = 2.0
