"""PPO's clipped value loss, values derived by hand.

loss_t = 0.5 * max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2), token-mean over 2 tokens, c = 0.5.
"""
from __future__ import annotations

import pytest
import torch

from rlfleet.extensions import LOSS_AGGREGATIONS
from services.learner.algorithms.aggregation import BatchCounts
from services.learner.critic import clipped_value_loss

pytestmark = pytest.mark.unit

OLD_B_T = torch.tensor([[0.0, 0.0]])
RETURNS_B_T = torch.tensor([[1.0, 0.8]])
MASK_B_T = torch.ones(1, 2)
WEIGHTS_B_T = LOSS_AGGREGATIONS.get("token-mean")(MASK_B_T, BatchCounts.of([MASK_B_T]))


def test_clipped_value_loss_hand_computed() -> None:
    # token 0: V = 0.4 within old +- 0.5: both terms (0.4 - 1)^2 = 0.36 -> 0.18, grad (V - R) / 2 = -0.3
    # token 1: V = 1.0 beyond old + 0.5: unclipped (1 - 0.8)^2 = 0.04, clipped (0.5 - 0.8)^2 = 0.09
    #          max 0.09 -> 0.045, the clipped term was chosen: no gradient
    # loss = (0.18 + 0.045) / 2 = 0.1125 ; clipfrac 1/2
    values_B_T = torch.tensor([[0.4, 1.0]], requires_grad=True)
    loss, vf_loss, clipfrac = clipped_value_loss(values_B_T, OLD_B_T, RETURNS_B_T, MASK_B_T, WEIGHTS_B_T, 0.5)
    assert float(loss.detach()) == pytest.approx(0.1125) and float(vf_loss) == pytest.approx(0.1125)
    assert float(clipfrac) == pytest.approx(0.5)
    loss.backward()
    torch.testing.assert_close(values_B_T.grad, torch.tensor([[-0.3, 0.0]]))


def test_unclipped_value_loss() -> None:
    # 0.5 * (0.36 + 0.04) / 2 = 0.1 ; grads (V - R) / 2 = [-0.3, 0.1]
    values_B_T = torch.tensor([[0.4, 1.0]], requires_grad=True)
    loss, _, clipfrac = clipped_value_loss(values_B_T, OLD_B_T, RETURNS_B_T, MASK_B_T, WEIGHTS_B_T, None)
    assert float(loss.detach()) == pytest.approx(0.1) and float(clipfrac) == 0.0
    loss.backward()
    torch.testing.assert_close(values_B_T.grad, torch.tensor([[-0.3, 0.1]]))


def test_masked_tokens_do_not_count() -> None:
    mask_B_T = torch.tensor([[1, 0]])
    weights_B_T = LOSS_AGGREGATIONS.get("token-mean")(mask_B_T, BatchCounts.of([mask_B_T]))
    loss, _, _ = clipped_value_loss(torch.tensor([[0.4, float("nan")]]), OLD_B_T, RETURNS_B_T, mask_B_T,
                                    weights_B_T, 0.5)
    assert float(loss) == pytest.approx(0.18)
