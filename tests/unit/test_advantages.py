"""Group-relative advantages, with expected values derived by hand.

Convention under test: unbiased std (divisor G - 1, torch.std's default, as in
verl), eps = 1e-6 added to the std.
"""
from __future__ import annotations

import math

import pytest
import torch

from rlfleet.advantages.group import batch_group_advantages, group_advantages


def test_binary_group_hand_computed() -> None:
    # r = [1, 0, 0, 1]; mean = 0.5; deviations = [+0.5, -0.5, -0.5, +0.5]
    # unbiased var = (4 * 0.25) / (4 - 1) = 1/3; std = sqrt(1/3) = 0.5773503
    # A = ±0.5 / (0.5773503 + 1e-6) = ±0.8660239   (±sqrt(3)/2 = ±0.8660254 without eps)
    adv_G = group_advantages([1.0, 0.0, 0.0, 1.0])
    torch.testing.assert_close(adv_G, torch.tensor([0.8660239, -0.8660239, -0.8660239, 0.8660239]))


def test_graded_group_hand_computed() -> None:
    # r = [2, 4, 6]; mean = 4; deviations = [-2, 0, 2]
    # unbiased var = (4 + 0 + 4) / 2 = 4; std = 2
    # A = [-2, 0, 2] / (2 + 1e-6) = [-0.9999995, 0, 0.9999995]
    adv_G = group_advantages(torch.tensor([2.0, 4.0, 6.0]))
    torch.testing.assert_close(adv_G, torch.tensor([-0.9999995, 0.0, 0.9999995]))


def test_unbiased_not_population_std() -> None:
    # Population std of [1, 0, 0, 1] is 0.5, which would give exactly ±1.0;
    # the unbiased convention must give the smaller ±0.866.
    adv_G = group_advantages([1.0, 0.0, 0.0, 1.0])
    assert abs(float(adv_G[0]) - math.sqrt(3) / 2) < 1e-5
    assert abs(float(adv_G[0]) - 1.0) > 0.1


@pytest.mark.parametrize("value", [0.0, 1.0, 0.7, -3.3])
def test_all_equal_rewards_give_exact_zeros(value: float) -> None:
    # No reward spread -> no signal. G = 7 is chosen because the float32 mean of
    # [0.7] * 7 is 0.7 - 6e-8 (likewise -3.3), and (r - mean) / (std + eps) would
    # then give a spurious advantage of about 0.056 (0.19 for -3.3); the result
    # must be exactly zero, not merely small.
    adv_G = group_advantages([value] * 7)
    assert torch.equal(adv_G, torch.zeros(7))
    assert torch.equal(group_advantages([value] * 7, normalize_std=False), torch.zeros(7))


def test_group_of_one_gives_zero() -> None:
    # A lone sample has no group baseline; an absolute reward is not an advantage.
    assert torch.equal(group_advantages([5.0]), torch.zeros(1))
    assert torch.equal(group_advantages([5.0], normalize_std=False), torch.zeros(1))


def test_empty_group_gives_empty() -> None:
    assert group_advantages([]).shape == (0,)


def test_normalize_std_false_only_centres() -> None:
    # [1, 0, 0, 1] - 0.5 = [0.5, -0.5, -0.5, 0.5]
    # [3, 1, 2] - 2     = [1, -1, 0]
    torch.testing.assert_close(
        group_advantages([1.0, 0.0, 0.0, 1.0], normalize_std=False), torch.tensor([0.5, -0.5, -0.5, 0.5])
    )
    torch.testing.assert_close(
        group_advantages([3.0, 1.0, 2.0], normalize_std=False), torch.tensor([1.0, -1.0, 0.0])
    )


def test_advantages_sum_to_zero() -> None:
    adv_G = group_advantages([0.3, 0.9, 0.1, 0.5, 0.2])
    assert abs(float(adv_G.sum())) < 1e-5


def test_integer_tensor_and_dtype() -> None:
    # Integer rewards are accepted and promoted to float32; float64 is kept.
    assert group_advantages(torch.tensor([1, 0, 0, 1])).dtype == torch.float32
    assert group_advantages(torch.tensor([1.0, 0.0], dtype=torch.float64)).dtype == torch.float64


def test_non_finite_reward_rejected() -> None:
    with pytest.raises(ValueError, match="non-finite"):
        group_advantages([1.0, float("nan"), 0.0])


def test_batch_group_advantages() -> None:
    # Each group is normalised only against itself; sizes may differ.
    groups = [[1.0, 0.0, 0.0, 1.0], [5.0], [2.0, 2.0], [3.0, 1.0, 2.0]]
    out = batch_group_advantages(groups, normalize_std=False)
    assert out == [[0.5, -0.5, -0.5, 0.5], [0.0], [0.0, 0.0], [1.0, -1.0, 0.0]]
    normed = batch_group_advantages([[1.0, 0.0, 0.0, 1.0]])
    assert isinstance(normed[0][0], float)
    assert normed[0] == pytest.approx([0.8660239, -0.8660239, -0.8660239, 0.8660239], abs=1e-6)


def test_the_list_estimators_give_the_textbook_floats_bit_for_bit():
    """group_lists runs its checks in C (issue 44): the floats must be those of the plain formulas."""
    import math
    import random

    from rlfleet.advantages.group_lists import group_advantages as lists_grpo
    from rlfleet.advantages.group_lists import rloo_advantages as lists_rloo

    def textbook(rewards, normalize_std=True, eps=1e-6):
        if len(rewards) <= 1 or all(r == rewards[0] for r in rewards):
            return [0.0] * len(rewards)
        mean = math.fsum(rewards) / len(rewards)
        centred = [r - mean for r in rewards]
        if not normalize_std:
            return centred
        std = math.sqrt(math.fsum(c * c for c in centred) / (len(rewards) - 1))
        return [c / (std + eps) for c in centred]

    rng = random.Random(7)
    groups = [[0.0, -0.0], [1.0], [], [0.5, 0.5, 0.5], [1, 0, 1, 0]]
    groups += [[rng.choice([0.0, 0.5, 1.0, -0.0]) for _ in range(8)] for _ in range(300)]
    groups += [[rng.uniform(-3, 3) for _ in range(rng.randint(2, 16))] for _ in range(300)]
    for rewards in groups:
        floats = [float(r) for r in rewards]
        assert lists_grpo(rewards) == textbook(floats)
        assert lists_grpo(rewards, normalize_std=False) == textbook(floats, normalize_std=False)
        size = len(floats)
        expected_rloo = [0.0] * size if size <= 1 or all(r == floats[0] for r in floats) else \
            [(r - math.fsum(floats) / size) * (size / (size - 1)) for r in floats]
        assert lists_rloo(rewards) == expected_rloo
        # the same bits, not only equal values (0.0 vs -0.0)
        assert [math.copysign(1, a) for a in lists_grpo(rewards)] == \
            [math.copysign(1, a) for a in textbook(floats)]
    with pytest.raises(ValueError, match="non-finite"):
        lists_grpo([0.0, float("nan")])
