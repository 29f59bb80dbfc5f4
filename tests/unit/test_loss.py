"""Per-token quantities (log-probs, entropy, masked means), with expected values derived by hand.

The losses built from them are tested in test_policy_losses.py, test_kl.py, test_aggregation.py.
"""
from __future__ import annotations

import math

import pytest
import torch

from services.learner.loss import LOG_RATIO_CLAMP, masked_token_mean, token_entropy, token_logprobs


def _close(actual: torch.Tensor | float, expected: float | list, atol: float = 1e-6) -> None:
    actual_t = torch.as_tensor(actual, dtype=torch.float32)
    torch.testing.assert_close(actual_t, torch.tensor(expected), atol=atol, rtol=0)


# --------------------------------------------------------------------------- token_logprobs / entropy


def test_token_logprobs_hand_computed_softmax() -> None:
    # logits = log([1, 2, 5]) -> softmax = [1/8, 2/8, 5/8]
    #   target 2: log(5/8) = -0.4700036 ; target 0: log(1/8) = -2.0794415
    # temperature 0.5 doubles the logits -> log([1, 4, 25]) -> softmax = [1/30, 4/30, 25/30]
    #   target 2: log(25/30) = -0.1823216 ; target 0: log(1/30) = -3.4011974
    logits_B_T_V = torch.log(torch.tensor([[[1.0, 2.0, 5.0], [1.0, 2.0, 5.0]]]))
    targets_B_T = torch.tensor([[2, 0]])
    _close(token_logprobs(logits_B_T_V, targets_B_T), [[-0.4700036, -2.0794415]])
    _close(token_logprobs(logits_B_T_V, targets_B_T, temperature=0.5), [[-0.1823216, -3.4011974]])


def test_token_logprobs_bf16_input_computed_in_fp32() -> None:
    # Uniform logits over V = 4: every logprob is log(1/4) = -1.3862944, in float32.
    logits_B_T_V = torch.zeros(2, 3, 4, dtype=torch.bfloat16)
    out_B_T = token_logprobs(logits_B_T_V, torch.zeros(2, 3, dtype=torch.long))
    assert out_B_T.dtype == torch.float32
    _close(out_B_T, [[-1.3862944] * 3] * 2)


def test_token_logprobs_matches_log_softmax_and_has_grad() -> None:
    gen = torch.Generator().manual_seed(0)
    logits_B_T_V = torch.randn(2, 3, 5, generator=gen, requires_grad=True)
    targets_B_T = torch.randint(0, 5, (2, 3), generator=gen)
    expected = torch.log_softmax(logits_B_T_V / 0.7, dim=-1).gather(-1, targets_B_T.unsqueeze(-1)).squeeze(-1)
    out_B_T = token_logprobs(logits_B_T_V, targets_B_T, temperature=0.7)
    torch.testing.assert_close(out_B_T, expected)
    out_B_T.sum().backward()
    assert logits_B_T_V.grad is not None and torch.isfinite(logits_B_T_V.grad).all()


def test_entropy_uniform_is_log_v() -> None:
    # Uniform over V = 4: H = log 4 = 1.3862944 at any temperature.
    logits_B_T_V = torch.full((2, 3, 4), 7.0)
    _close(token_entropy(logits_B_T_V), [[1.3862944] * 3] * 2)
    _close(token_entropy(logits_B_T_V, temperature=0.3), [[1.3862944] * 3] * 2)


def test_entropy_hand_computed_and_banned_token() -> None:
    # p = [1/8, 2/8, 5/8]: H = 1/8 ln 8 + 1/4 ln 4 + 5/8 ln(8/5)
    #                        = 0.2599302 + 0.3465736 + 0.2937523 = 0.9002561
    # Appending a -inf logit (p = 0) must not change H nor produce NaN.
    logits_B_T_V = torch.log(torch.tensor([[[1.0, 2.0, 5.0, 0.0]]]))  # log 0 = -inf
    _close(token_entropy(logits_B_T_V), [[0.9002561]])


# --------------------------------------------------------------------------- masked_token_mean


def test_masked_token_mean_hand_computed() -> None:
    # mask keeps 1, 2, 4 -> (1 + 2 + 4) / 3 = 2.3333333 ; with normalizer 7: 7 / 7 = 1
    values_B_T = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask_B_T = torch.tensor([[1, 1, 0], [1, 0, 0]])
    _close(masked_token_mean(values_B_T, mask_B_T), 7.0 / 3.0)
    _close(masked_token_mean(values_B_T, mask_B_T, normalizer=7.0), 1.0)


def test_masked_token_mean_ignores_nan_in_padding() -> None:
    values_B_T = torch.tensor([[2.0, float("nan")], [float("inf"), 4.0]])
    mask_B_T = torch.tensor([[True, False], [False, True]])
    _close(masked_token_mean(values_B_T, mask_B_T), 3.0)


def test_micro_batched_token_mean_sums_exactly() -> None:
    # Values are multiples of 1/4 and the global count is 8 (a power of two), so
    # every partial sum and every division is exact in float32 and the two
    # routes must agree bit for bit.
    # Unmasked values: 1.5 0.25 -2 | 3 | 0.75 1 -0.5 | 2  -> sum 6.0, count 8 -> 0.75
    values_B_T = torch.tensor(
        [[1.5, 0.25, -2.0, 9.0], [3.0, 9.0, 9.0, 9.0], [0.75, 1.0, -0.5, 9.0], [2.0, 9.0, 9.0, 9.0]]
    )
    mask_B_T = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0]])
    full = masked_token_mean(values_B_T, mask_B_T)
    # micro-batch 1: (1.5 + 0.25 - 2 + 3) / 8 = 2.75 / 8 ; micro-batch 2: (0.75 + 1 - 0.5 + 2) / 8 = 3.25 / 8
    micro = sum(masked_token_mean(values_B_T[i : i + 2], mask_B_T[i : i + 2], normalizer=8.0) for i in (0, 2))
    assert float(full) == 0.75
    assert torch.equal(micro, full)


def test_masked_token_mean_rejects_bad_normalizer() -> None:
    with pytest.raises(ValueError, match="normalizer"):
        masked_token_mean(torch.ones(1, 2), torch.ones(1, 2), normalizer=0.0)


def test_log_ratio_constant_matches_exp_bound() -> None:
    # Guard against someone raising the clamp past float32's exp range (~88.7).
    assert math.isfinite(math.exp(LOG_RATIO_CLAMP)) and LOG_RATIO_CLAMP < 88.0
