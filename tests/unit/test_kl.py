"""KL estimators k1, k2, k3 of KL(policy || reference), values derived by hand.

d = logp - ref (log of p_policy / p_ref at a token sampled from the policy).
"""
from __future__ import annotations

import pytest
import torch

from rlfleet.extensions import KL_ESTIMATORS
from services.learner.algorithms.kl import kl_k1, kl_k2, kl_k3

pytestmark = pytest.mark.unit

LOGP_B_T = torch.tensor([[-1.0, -2.0, -0.7]])
REF_B_T = torch.tensor([[-1.5, -1.0, -0.7]])  # d = [0.5, -1.0, 0]


def _close(actual, expected) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected), atol=1e-6, rtol=0)


def test_k1_is_the_log_ratio() -> None:
    # k1 = d = [0.5, -1.0, 0]: unbiased but negative on the second token
    _close(kl_k1(LOGP_B_T, REF_B_T), [[0.5, -1.0, 0.0]])


def test_k2_is_half_the_squared_log_ratio() -> None:
    # k2 = d^2 / 2 = [0.125, 0.5, 0]
    _close(kl_k2(LOGP_B_T, REF_B_T), [[0.125, 0.5, 0.0]])


def test_k3_hand_computed() -> None:
    # k3 = e^-d + d - 1:
    #   d = 0.5:  0.6065307 + 0.5 - 1 = 0.1065307
    #   d = -1.0: 2.7182818 - 1 - 1   = 0.7182818
    #   d = 0:    1 + 0 - 1           = 0
    _close(kl_k3(LOGP_B_T, REF_B_T), [[0.1065307, 0.7182818, 0.0]])


def test_all_estimators_vanish_when_policy_equals_reference() -> None:
    for name in KL_ESTIMATORS.names():
        _close(KL_ESTIMATORS.get(name)(LOGP_B_T, LOGP_B_T.clone()), [[0.0, 0.0, 0.0]])


def test_k3_clamps_and_has_no_nan_gradient() -> None:
    # ref - logp = 5   -> e^5 - 6 = 142.41 -> clamped to 10
    # ref - logp = -30 -> clamped to -20 -> e^-20 + 19 = 19.000000002 -> clamped to 10
    # ref - logp = 1e4 -> clamped to 20 -> e^20 - 21 ~ 4.9e8 (finite) -> clamped to 10
    logp_B_T = torch.tensor([[0.0, 0.0, -1e4]], requires_grad=True)
    k3_B_T = kl_k3(logp_B_T, torch.tensor([[5.0, -30.0, 0.0]]))
    _close(k3_B_T, [[10.0, 10.0, 10.0]])
    k3_B_T.sum().backward()
    assert torch.equal(logp_B_T.grad, torch.zeros(1, 3))  # clamped tokens get zero gradient, never NaN


def test_k1_and_k2_clamp_the_log_ratio_at_20() -> None:
    # d = 1e4 is clamped to 20: k1 = 20, k2 = 200
    logp_B_T, ref_B_T = torch.tensor([[0.0]]), torch.tensor([[-1e4]])
    _close(kl_k1(logp_B_T, ref_B_T), [[20.0]])
    _close(kl_k2(logp_B_T, ref_B_T), [[200.0]])


def test_shape_mismatch_rejected() -> None:
    with pytest.raises(ValueError, match="shape mismatch"):
        kl_k1(torch.zeros(1, 2), torch.zeros(1, 3))
