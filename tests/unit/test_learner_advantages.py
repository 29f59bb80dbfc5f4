"""Token-level advantages computed by the learner (reinforce_pp, gae, KL in reward), by hand.

Two rows of T = 5 positions laid out as the learner collates them (prompt, response, padding):
    row 0: mask [0, 1, 1, 1, 0]  reward 1.0   (response at t = 1..3, one padding position)
    row 1: mask [0, 0, 0, 1, 1]  reward 0.5   (response at t = 3..4)
"""
from __future__ import annotations

import pytest
import torch

from rlfleet.advantages import ADVANTAGE_ESTIMATORS
from rlfleet.advantages.token import (
    AdvantageInputs,
    broadcast,
    discounted_returns,
    gae,
    token_rewards,
    whiten,
)

pytestmark = pytest.mark.unit

MASK_B_T = torch.tensor([[0, 1, 1, 1, 0], [0, 0, 0, 1, 1]])
REWARDS_B = torch.tensor([1.0, 0.5])
KL_B_T = torch.full((2, 5), 0.1)  # kl_coef * kl on every position (masked ones must not count)


def _close(actual, expected, atol: float = 1e-6) -> None:
    torch.testing.assert_close(torch.as_tensor(actual, dtype=torch.float32),
                               torch.tensor(expected, dtype=torch.float32), atol=atol,
                               rtol=0)


def test_token_rewards_sit_on_the_last_response_token() -> None:
    _close(token_rewards(REWARDS_B, MASK_B_T), [[0, 0, 0, 1.0, 0], [0, 0, 0, 0, 0.5]])
    # With the KL penalty every response token loses 0.1: 1 - 0.1 = 0.9, 0.5 - 0.1 = 0.4
    _close(token_rewards(REWARDS_B, MASK_B_T, KL_B_T), [[0, -0.1, -0.1, 0.9, 0], [0, 0, 0, -0.1, 0.4]])


def test_token_rewards_of_a_fully_masked_row_are_zero() -> None:
    _close(token_rewards(torch.tensor([1.0]), torch.zeros(1, 3)), [[0.0, 0.0, 0.0]])


def test_discounted_returns() -> None:
    rewards_B_T = token_rewards(REWARDS_B, MASK_B_T)
    # gamma = 1: every response token sees the final reward
    _close(discounted_returns(rewards_B_T, MASK_B_T, 1.0), [[0, 1, 1, 1, 0], [0, 0, 0, 0.5, 0.5]])
    # gamma = 0.5: row 0 t=3: 1, t=2: 0.5, t=1: 0.25 ; row 1 t=4: 0.5, t=3: 0.25
    _close(discounted_returns(rewards_B_T, MASK_B_T, 0.5), [[0, 0.25, 0.5, 1, 0], [0, 0, 0, 0.25, 0.5]])
    # KL-shaped, gamma = 1: row 0 t=3: 0.9, t=2: -0.1 + 0.9 = 0.8, t=1: 0.7 ; row 1 t=4: 0.4, t=3: 0.3
    _close(discounted_returns(token_rewards(REWARDS_B, MASK_B_T, KL_B_T), MASK_B_T, 1.0),
           [[0, 0.7, 0.8, 0.9, 0], [0, 0, 0, 0.3, 0.4]])


def test_gae_hand_computed_and_padding_values_ignored() -> None:
    # Row 0 only; values on the response [0.5, 0.6, 0.8], garbage 9 on prompt and padding.
    values_B_T = torch.tensor([[9.0, 0.5, 0.6, 0.8, 9.0]])
    rewards_B_T = token_rewards(torch.tensor([1.0]), MASK_B_T[:1])
    # gamma = lam = 1: A_t = R - V_t = [0.5, 0.4, 0.2]; returns A + V = [1, 1, 1]
    adv, ret = gae(rewards_B_T, values_B_T, MASK_B_T[:1], 1.0, 1.0)
    _close(adv, [[0, 0.5, 0.4, 0.2, 0]])
    _close(ret, [[0, 1.0, 1.0, 1.0, 0]])
    # gamma = 1, lam = 0.5: deltas t=3: 1 + 0 - 0.8 = 0.2 ; t=2: 0.8 - 0.6 = 0.2 ; t=1: 0.6 - 0.5 = 0.1
    #   A_3 = 0.2 ; A_2 = 0.2 + 0.5 * 0.2 = 0.3 ; A_1 = 0.1 + 0.5 * 0.3 = 0.25 ; returns = [0.75, 0.9, 1.0]
    adv, ret = gae(rewards_B_T, values_B_T, MASK_B_T[:1], 1.0, 0.5)
    _close(adv, [[0, 0.25, 0.3, 0.2, 0]])
    _close(ret, [[0, 0.75, 0.9, 1.0, 0]])


def test_whiten_across_micro_batches() -> None:
    # Tokens 1, 2 | 3, 4: mean 2.5, unbiased std sqrt((2.25 + 0.25 + 0.25 + 2.25) / 3) = sqrt(5/3) = 1.2909944
    out = whiten([torch.tensor([[1.0, 2.0, 7.0]]), torch.tensor([[3.0, 4.0]])],
                 [torch.tensor([[1, 1, 0]]), torch.tensor([[1, 1]])])
    _close(out[0], [[-1.1618950, -0.3872983, 0.0]])
    _close(out[1], [[0.3872983, 1.1618950]])


def test_whiten_all_equal_or_single_token_gives_zeros() -> None:
    assert torch.equal(whiten([torch.full((2, 3), 0.7)], [torch.ones(2, 3)])[0], torch.zeros(2, 3))
    assert torch.equal(whiten([torch.tensor([[5.0, 1.0]])], [torch.tensor([[1, 0]])])[0], torch.zeros(1, 2))


def _inputs(**kw) -> list[AdvantageInputs]:
    base = {"rewards_B": REWARDS_B, "sequence_advantages_B": torch.tensor([1.0, -1.0]), "mask_B_T": MASK_B_T}
    base.update(kw)
    return [AdvantageInputs(**base)]


def test_reinforce_pp_whitens_returns_over_the_batch() -> None:
    # Returns on tokens: row 0 [1, 1, 1], row 1 [0.5, 0.5]; mean 4 / 5 = 0.8
    # squared deviations 3 * 0.04 + 2 * 0.09 = 0.3; unbiased var 0.3 / 4 = 0.075; std 0.2738613
    # row 0: 0.2 / 0.2738613 = 0.7302967 ; row 1: -0.3 / 0.2738613 = -1.0954451
    (out,) = ADVANTAGE_ESTIMATORS.get("reinforce_pp").token(_inputs(), 1.0, 1.0)
    _close(out.advantages_B_T, [[0, 0.7302967, 0.7302967, 0.7302967, 0], [0, 0, 0, -1.0954451, -1.0954451]])
    assert out.returns_B_T is None


def test_reinforce_pp_equal_rewards_give_zero() -> None:
    (out,) = ADVANTAGE_ESTIMATORS.get("reinforce_pp").token(_inputs(rewards_B=torch.tensor([1.0, 1.0])),
                                                            1.0, 1.0)
    assert torch.equal(out.advantages_B_T, torch.zeros(2, 5))


def test_group_advantages_broadcast_and_kl_return_to_go() -> None:
    # Controller advantages [1, -1] on every response token
    (out,) = broadcast(_inputs(), 1.0, 1.0)
    _close(out.advantages_B_T, [[0, 1, 1, 1, 0], [0, 0, 0, -1, -1]])
    # With the KL in the reward (0.1 per token), minus its return-to-go:
    #   row 0: [0.3, 0.2, 0.1] -> [0.7, 0.8, 0.9] ; row 1: [0.2, 0.1] -> [-1.2, -1.1]
    (out,) = broadcast(_inputs(kl_penalty_B_T=KL_B_T), 1.0, 1.0)
    _close(out.advantages_B_T, [[0, 0.7, 0.8, 0.9, 0], [0, 0, 0, -1.2, -1.1]])


def test_gae_estimator_whitens_advantages_and_returns_value_targets() -> None:
    # Values 0 everywhere, gamma = lam = 1: raw advantages = returns = row 0 [1, 1, 1], row 1 [0.5, 0.5],
    # whitened as in the reinforce_pp test; the value targets stay raw.
    (out,) = ADVANTAGE_ESTIMATORS.get("gae").token(_inputs(values_B_T=torch.zeros(2, 5)), 1.0, 1.0)
    assert ADVANTAGE_ESTIMATORS.get("gae").needs_values and not ADVANTAGE_ESTIMATORS.get("grpo").needs_values
    _close(out.advantages_B_T, [[0, 0.7302967, 0.7302967, 0.7302967, 0], [0, 0, 0, -1.0954451, -1.0954451]])
    _close(out.returns_B_T, [[0, 1, 1, 1, 0], [0, 0, 0, 0.5, 0.5]])
