"""Controller side of the algorithms: group estimators (grpo, dr_grpo, rloo), DAPO's overlong shaping
and dynamic sampling, and the staleness gate's accounting of dropped groups. Values derived by hand."""
from __future__ import annotations

import threading

import pytest

from rlfleet.advantages import ADVANTAGE_ESTIMATORS
from controller.groups import ScoredGroup
from controller.loop import GRPOLoop
from controller.sample_builder import SampleBuilder, overlong_penalty
from rlfleet.algorithm import AlgorithmConfig
from rlfleet.config import JobConfig
from rlfleet.data.prompts import Prompt
from rlfleet.errors import RlfleetError
from rlfleet.types import Completion, ScoreResult

pytestmark = pytest.mark.unit

PROMPT = Prompt(index=0, text="Reverse the digits: 123", prompt_ids=[7, 8], data_source="digits_reverse",
                ground_truth="321")


def group(scores: list[float], lengths: list[int] | None = None, version: int = 0,
          seq: int = 0) -> ScoredGroup:
    lengths = lengths or [3] * len(scores)
    completions = [Completion(token_ids=[5] * n, logprobs=[-0.5] * n, finish_reason="stop",
                              policy_version=version)
                   for n in lengths]
    return ScoredGroup(seq, PROMPT, completions,
                       [ScoreResult(id=f"r/{i}", score=s) for i, s in enumerate(scores)])


# --------------------------------------------------------------------------- group estimators


def estimator(name: str):
    """What the controller computes for one group under `algorithm.advantage=name`."""
    return ADVANTAGE_ESTIMATORS.get(name).group_advantages


def test_grpo_normalises_by_the_unbiased_std() -> None:
    # [1, 0, 0, 1]: mean 0.5, unbiased std sqrt(1/3) = 0.5773503 -> +-0.5 / 0.5773503 = +-0.8660254
    assert estimator("grpo")([1.0, 0.0, 0.0, 1.0]) == pytest.approx([0.8660254, -0.8660254,
                                                                     -0.8660254, 0.8660254], abs=1e-5)


def test_dr_grpo_only_centres() -> None:
    assert estimator("dr_grpo")([1.0, 0.0, 0.0, 1.0]) == pytest.approx([0.5, -0.5, -0.5, 0.5])


def test_rloo_leave_one_out_baseline() -> None:
    # [1, 0, 0, 1]: a 1's baseline is (0 + 0 + 1) / 3 = 1/3 -> 2/3 ; a 0's is (1 + 0 + 1) / 3 = 2/3 -> -2/3
    assert estimator("rloo")([1.0, 0.0, 0.0, 1.0]) == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])
    # [3, 1, 2]: 3 - (1 + 2) / 2 = 1.5 ; 1 - (3 + 2) / 2 = -1.5 ; 2 - (3 + 1) / 2 = 0
    assert estimator("rloo")([3.0, 1.0, 2.0]) == pytest.approx([1.5, -1.5, 0.0])


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_edge_cases_all_equal_and_length_one_groups_give_zero(name: str) -> None:
    advantages = estimator(name)
    assert advantages([0.7] * 5) == [0.0] * 5  # no signal: exactly zero, not ulp / eps
    assert advantages([5.0]) == [0.0]  # a lone sample has nothing to be compared with
    assert advantages([]) == []


@pytest.mark.parametrize("name", ["reinforce_pp", "gae"])
def test_learner_side_estimators_send_zero(name: str) -> None:
    assert estimator(name)([1.0, 0.0]) == [0.0, 0.0]


# --------------------------------------------------------------------------- overlong shaping


@pytest.mark.parametrize(("length", "expected"), [
    (6, 0.0),    # L = 8, buffer c = 2: the penalty zone starts after 8 - 2 = 6 tokens
    (7, -0.5),   # -(7 - 6) / 2
    (8, -1.0),   # -(8 - 6) / 2: a response that hit the limit
    (9, -1.0),   # never worse than the full penalty
])
def test_overlong_penalty(length: int, expected: float) -> None:
    assert overlong_penalty(length, max_tokens=8, buffer_tokens=2, penalty=1.0) == pytest.approx(expected)


def test_overlong_penalty_disabled_by_a_zero_buffer() -> None:
    assert overlong_penalty(100, max_tokens=8, buffer_tokens=0, penalty=1.0) == 0.0


def test_builder_shapes_rewards_then_computes_advantages() -> None:
    # L = 8, ratio 0.25 -> c = 2, penalty factor 0.5. Scores [1, 1], lengths [5, 8]:
    # shaped [1, 1 - 0.5] = [1, 0.5]; dr_grpo: mean 0.75 -> advantages [0.25, -0.25]
    builder = SampleBuilder(AlgorithmConfig(advantage="dr_grpo", overlong_buffer_ratio=0.25,
                                            overlong_penalty=0.5),
                            max_new_tokens=8)
    samples, metrics = builder.build([group([1.0, 1.0], lengths=[5, 8])])
    assert [s.reward for s in samples] == pytest.approx([1.0, 0.5])
    assert [s.advantage for s in samples] == pytest.approx([0.25, -0.25])
    assert metrics["reward/overlong_penalty_mean"] == pytest.approx(-0.25)
    assert metrics["reward/shaped_mean"] == pytest.approx(0.75)


# --------------------------------------------------------------------------- dynamic sampling


def test_dynamic_sampling_keeps_only_groups_with_reward_variance() -> None:
    builder = SampleBuilder(AlgorithmConfig(dynamic_sampling=True), max_new_tokens=8)
    assert not builder.keep(group([1.0, 1.0, 1.0]))
    assert not builder.keep(group([0.0, 0.0]))
    assert builder.keep(group([1.0, 0.0, 1.0]))
    # Shaping counts: equal scores but different lengths inside the overlong zone differ after shaping.
    shaped = SampleBuilder(AlgorithmConfig(dynamic_sampling=True, overlong_buffer_ratio=0.25),
                           max_new_tokens=8)
    assert shaped.keep(group([1.0, 1.0], lengths=[5, 8]))
    assert SampleBuilder(AlgorithmConfig(), 8).keep(group([1.0, 1.0]))  # off: everything is kept


def _loop(**algorithm) -> GRPOLoop:
    cfg = JobConfig.model_validate({"controller": {"prompts_per_step": 2, "max_staleness": 1},
                                    "algorithm": algorithm})
    return GRPOLoop(cfg, source=None, rollout=None, reward=None, learner=None, writer=None,
                    stop=threading.Event())


def _buffer(loop: GRPOLoop, groups: list[ScoredGroup]) -> None:
    for g in groups:
        loop._buffer.append((g.version, g.seq, g))
    loop._buffer.sort()
    loop._admitted = len(groups)


def test_take_batch_gives_back_admission_slots_of_filtered_and_stale_groups() -> None:
    # B = 2, staleness 1, training version 2: the version-0 group is stale; of the fresh ones,
    # two have equal rewards and are filtered; two are kept. Four slots go back to the gate.
    loop = _loop(dynamic_sampling=True)
    _buffer(loop, [group([1.0, 0.0], version=0, seq=0), group([1.0, 1.0], version=1, seq=1),
                   group([0.5, 0.5], version=1, seq=2), group([1.0, 0.0], version=2, seq=3),
                   group([0.0, 1.0], version=2, seq=4), group([1.0, 0.0], version=2, seq=5)])
    batch, dropped = loop._take_batch(train_version=2)
    assert [g.seq for g in batch] == [3, 4]
    assert dropped == {"stale": 1, "filtered": 2}
    assert loop._admitted == 6 - 3  # the three dropped gave their slots back; one group is still buffered
    assert len(loop._buffer) == 1


def test_dynamic_sampling_gives_up_after_max_gen_batches() -> None:
    # max_gen_batches = 1 with B = 2: the third equal-reward group in one step is an error.
    loop = _loop(dynamic_sampling=True, max_gen_batches=1)
    _buffer(loop, [group([1.0, 1.0], seq=i) for i in range(3)])
    with pytest.raises(RlfleetError, match="max_gen_batches"):
        loop._take_batch(train_version=0)
