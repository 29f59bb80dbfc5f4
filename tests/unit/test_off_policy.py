"""Off-policy corrections: none, truncated IS, AReaL's decoupled PPO; values derived by hand.

behaviour mu = -1 on three tokens; the learner's old/proximal policy is -1 + log([1.5, 3, 0.5]),
so the behaviour importance weights pi_old / mu are [1.5, 3, 0.5]; is_cap = 2.
"""
from __future__ import annotations

import math

import pytest
import torch

from rlfleet.extensions import LOSS_AGGREGATIONS, OFF_POLICY
from services.learner.algorithms.aggregation import BatchCounts
from services.learner.algorithms.objective import ObjectiveSettings, micro_batch_objective

pytestmark = pytest.mark.unit

BEHAVIOUR_B_T = torch.full((1, 3), -1.0)
OLD_B_T = -1.0 + torch.log(torch.tensor([[1.5, 3.0, 0.5]]))
MASK_B_T = torch.ones(1, 3)


def _close(actual, expected) -> None:
    torch.testing.assert_close(torch.as_tensor(actual, dtype=torch.float32), torch.tensor(expected),
                               atol=1e-6,
                               rtol=0)


def test_none_clips_against_behaviour_with_unit_weights() -> None:
    c = OFF_POLICY.get("none").apply(BEHAVIOUR_B_T, None, MASK_B_T, 2.0)
    assert not OFF_POLICY.get("none").recomputes_old
    assert torch.equal(c.base_logprobs_B_T, BEHAVIOUR_B_T)
    _close(c.is_weights_B_T, [[1.0, 1.0, 1.0]])


def test_tis_truncates_weights_at_the_cap() -> None:
    # weights min([1.5, 3, 0.5], 2) = [1.5, 2, 0.5]; the second was truncated
    c = OFF_POLICY.get("tis").apply(BEHAVIOUR_B_T, OLD_B_T, MASK_B_T, 2.0)
    assert OFF_POLICY.get("tis").recomputes_old
    assert torch.equal(c.base_logprobs_B_T, OLD_B_T)
    _close(c.is_weights_B_T, [[1.5, 2.0, 0.5]])
    _close(c.is_ratio_B_T, [[1.5, 3.0, 0.5]])
    assert c.capped_B_T.tolist() == [[False, True, False]]


def test_decoupled_drops_tokens_above_the_cap() -> None:
    # AReaL: weight 3 > 2 -> the token is dropped (weight 0), the others keep [1.5, 0.5]
    c = OFF_POLICY.get("decoupled").apply(BEHAVIOUR_B_T, OLD_B_T, MASK_B_T, 2.0)
    _close(c.is_weights_B_T, [[1.5, 0.0, 0.5]])
    assert c.capped_B_T.tolist() == [[False, True, False]]


def test_masked_tokens_get_weight_one_and_are_never_capped() -> None:
    # Padding holds a log-ratio of 100 (weight e^100 without the mask): it must not count as capped.
    old_B_T = torch.tensor([[-1.0, 99.0]])
    c = OFF_POLICY.get("tis").apply(torch.full((1, 2), -1.0), old_B_T, torch.tensor([[1, 0]]), 2.0)
    _close(c.is_ratio_B_T, [[1.0, 1.0]])
    assert not c.capped_B_T.any()


@pytest.mark.parametrize(("name", "loss", "grad"), [
    # First step after recomputation: logp = pi_old, so the PPO ratio is 1 and never clipped;
    # A = +1, token-mean over 3 tokens: pg_t = -w_t, grad_t = -w_t / 3.
    ("tis", -(1.5 + 2.0 + 0.5) / 3, [[-0.5, -2 / 3, -0.5 / 3]]),
    ("decoupled", -(1.5 + 0.0 + 0.5) / 3, [[-0.5, 0.0, -0.5 / 3]]),
])
def test_objective_weighs_each_token_by_its_correction(name: str, loss: float, grad: list) -> None:
    logp_B_T = OLD_B_T.clone().requires_grad_()
    correction = OFF_POLICY.get(name).apply(BEHAVIOUR_B_T, OLD_B_T, MASK_B_T, 2.0)
    weights_B_T = LOSS_AGGREGATIONS.get("token-mean")(MASK_B_T, BatchCounts.of([MASK_B_T]))
    out = micro_batch_objective(logp_B_T, torch.ones(1, 3), MASK_B_T, weights_B_T, correction,
                                ObjectiveSettings())
    _close(out.loss, loss)
    _close(out.metrics["actor/is_ratio_mean"], (1.5 + 3.0 + 0.5) / 3)
    _close(out.metrics["actor/is_clipfrac"], 1 / 3)
    _close(out.metrics["actor/pg_clipfrac"], 0.0)
    out.loss.backward()
    _close(logp_B_T.grad, grad)


def test_weights_are_constants() -> None:
    old_B_T = OLD_B_T.clone().requires_grad_()
    c = OFF_POLICY.get("tis").apply(BEHAVIOUR_B_T, old_B_T, MASK_B_T, 2.0)
    assert not c.is_weights_B_T.requires_grad and math.isclose(float(c.is_weights_B_T.sum()), 4.0,
                                                               rel_tol=1e-6)
