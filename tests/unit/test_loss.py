"""GRPO loss pieces, with expected values derived by hand in the comments.

Notation: r = exp(logp - logp_behaviour), A = sequence advantage,
pg = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high)), token-mean over mask.
"""
from __future__ import annotations

import math

import pytest
import torch

from services.learner.loss import (
    grpo_policy_loss,
    kl_k3,
    masked_token_mean,
    token_entropy,
    token_logprobs,
)


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


# --------------------------------------------------------------------------- kl_k3


def test_kl_k3_hand_computed() -> None:
    # d = ref - logp; k3 = e^d - d - 1
    #   logp -1.0, ref -1.5: d = -0.5 -> 0.6065307 + 0.5 - 1 = 0.1065307
    #   logp -2.0, ref -1.0: d = +1.0 -> 2.7182818 - 1 - 1   = 0.7182818
    #   logp -0.7, ref -0.7: d = 0    -> 1 - 0 - 1            = 0
    logp_B_T = torch.tensor([[-1.0, -2.0, -0.7]])
    ref_B_T = torch.tensor([[-1.5, -1.0, -0.7]])
    _close(kl_k3(logp_B_T, ref_B_T), [[0.1065307, 0.7182818, 0.0]])


def test_kl_k3_clamps() -> None:
    # d = 5   -> e^5 - 6 = 142.41 -> clamped to 10
    # d = -30 -> d clamped to -20 -> e^-20 + 19 = 19.000000002 -> clamped to 10
    # d = 1e4 -> d clamped to 20 -> e^20 - 21 ~ 4.9e8 (finite) -> clamped to 10
    logp_B_T = torch.tensor([[0.0, 0.0, -1e4]], requires_grad=True)
    ref_B_T = torch.tensor([[5.0, -30.0, 0.0]])
    k3_B_T = kl_k3(logp_B_T, ref_B_T)
    _close(k3_B_T, [[10.0, 10.0, 10.0]])
    k3_B_T.sum().backward()
    # Clamped tokens get zero gradient, and in particular no NaN from exp overflow.
    assert torch.equal(logp_B_T.grad, torch.zeros(1, 3))


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


# --------------------------------------------------------------------------- grpo_policy_loss


def test_on_policy_pg_loss_is_minus_mean_advantage() -> None:
    # On-policy r = 1 everywhere, never clipped, so pg = -A per token.
    # Tokens: three of sequence 0 (A = 1.0), one of sequence 1 (A = -0.5)
    # pg_loss = -(1 + 1 + 1 - 0.5) / 4 = -2.5 / 4 = -0.625
    logp_B_T = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -9.0, -9.0]])
    mask_B_T = torch.tensor([[1, 1, 1], [1, 0, 0]])
    out = grpo_policy_loss(logp_B_T, logp_B_T.clone(), torch.tensor([1.0, -0.5]), mask_B_T)
    _close(out.loss, -0.625)
    assert out.metrics() == pytest.approx(
        {"pg_loss": -0.625, "kl_loss": 0.0, "pg_clipfrac": 0.0, "ratio_mean": 1.0, "logprob_diff_mean": 0.0}
    )


def test_positive_advantage_clipped_above_one_plus_clip_high() -> None:
    # A = +1, clip 0.2 -> bounds [0.8, 1.2]
    #   token 0: log r = 0.1 -> r = e^0.1 = 1.1051709 <= 1.2, unclipped: pg = -1.1051709
    #   token 1: log r = 0.3 -> r = e^0.3 = 1.3498588 >  1.2:
    #            max(-1.3498588, -1.2) = -1.2 -> clipped
    # pg_loss = (-1.1051709 - 1.2) / 2 = -1.1525855 ; clipfrac = 1/2
    # ratio_mean = (1.1051709 + 1.3498588) / 2 = 1.2275149 ; |diff| mean = (0.1 + 0.3) / 2 = 0.2
    # grads: token 0: d(-A r / 2)/dlogp = -A r / 2 = -0.5525855 ; token 1: 0 (clipped)
    behaviour_B_T = torch.tensor([[-1.0, -1.0]])
    logp_B_T = (behaviour_B_T + torch.tensor([[0.1, 0.3]])).requires_grad_()
    out = grpo_policy_loss(logp_B_T, behaviour_B_T, torch.tensor([1.0]), torch.ones(1, 2))
    _close(out.pg_loss, -1.1525855)
    _close(out.pg_clipfrac, 0.5)
    _close(out.ratio_mean, 1.2275149)
    _close(out.logprob_diff_mean, 0.2)
    out.loss.backward()
    _close(logp_B_T.grad, [[-0.5525855, 0.0]])


def test_negative_advantage_clipped_below_one_minus_clip_low() -> None:
    # A = -1, clip 0.2 -> bounds [0.8, 1.2]
    #   token 0: log r = -0.1 -> r = 0.9048374 >= 0.8, unclipped: pg = -A r = 0.9048374
    #   token 1: log r = -0.3 -> r = 0.7408182 <  0.8: max(0.7408182, 0.8) = 0.8 -> clipped
    # pg_loss = (0.9048374 + 0.8) / 2 = 0.8524187 ; clipfrac = 1/2
    # grads: token 0: -A r / 2 = 0.4524187 ; token 1: 0 (clipped)
    behaviour_B_T = torch.tensor([[-2.0, -2.0]])
    logp_B_T = (behaviour_B_T + torch.tensor([[-0.1, -0.3]])).requires_grad_()
    out = grpo_policy_loss(logp_B_T, behaviour_B_T, torch.tensor([-1.0]), torch.ones(1, 2))
    _close(out.pg_loss, 0.8524187)
    _close(out.pg_clipfrac, 0.5)
    out.loss.backward()
    _close(logp_B_T.grad, [[0.4524187, 0.0]])


def test_clip_is_pessimistic_only() -> None:
    # The clip only bites in the direction A favours. Outside that direction the
    # unclipped term is the larger loss and is kept (gradient still flows):
    #   seq 0: A = +1, r = e^-0.3 = 0.7408182 < 0.8: max(-0.7408182, -0.8) = -0.7408182, unclipped
    #   seq 1: A = -1, r = e^+0.3 = 1.3498588 > 1.2: max(1.3498588, 1.2)   =  1.3498588, unclipped
    # pg_loss = (-0.7408182 + 1.3498588) / 2 = 0.3045203 ; clipfrac = 0
    behaviour_B_T = torch.tensor([[-1.0], [-1.0]])
    logp_B_T = behaviour_B_T + torch.tensor([[-0.3], [0.3]])
    out = grpo_policy_loss(logp_B_T, behaviour_B_T, torch.tensor([1.0, -1.0]), torch.ones(2, 1))
    _close(out.pg_loss, 0.3045203)
    _close(out.pg_clipfrac, 0.0)


def test_asymmetric_clip_low_and_high() -> None:
    # clip_low = 0.1, clip_high = 0.3 -> bounds [0.9, 1.3]
    #   seq 0: A = +1, r = e^0.25 = 1.2840254 <= 1.3 -> unclipped (would be clipped at 1.2 symmetric)
    #          pg = -1.2840254
    #   seq 1: A = -1, r = e^-0.15 = 0.8607080 < 0.9 -> clipped (would be unclipped at 0.8 symmetric)
    #          pg = max(0.8607080, 0.9) = 0.9
    # pg_loss = (-1.2840254 + 0.9) / 2 = -0.1920127 ; clipfrac = 1/2
    behaviour_B_T = torch.tensor([[-1.0], [-1.0]])
    logp_B_T = behaviour_B_T + torch.tensor([[0.25], [-0.15]])
    adv_B = torch.tensor([1.0, -1.0])
    out = grpo_policy_loss(logp_B_T, behaviour_B_T, adv_B, torch.ones(2, 1), clip_low=0.1, clip_high=0.3)
    _close(out.pg_loss, -0.1920127)
    _close(out.pg_clipfrac, 0.5)
    # Symmetric 0.2 for contrast: seq 0 clipped at 1.2 (pg -1.2), seq 1 unclipped (pg 0.8607080)
    # pg_loss = (-1.2 + 0.8607080) / 2 = -0.1696460 ; clipfrac = 1/2
    sym = grpo_policy_loss(logp_B_T, behaviour_B_T, adv_B, torch.ones(2, 1))
    _close(sym.pg_loss, -0.1696460)
    _close(sym.pg_clipfrac, 0.5)


def test_on_policy_gradient_is_minus_advantage_over_token_count() -> None:
    # On-policy, unclipped: pg_t = -A r_t and dr_t/dlogp_t = r_t = 1, so
    # dloss/dlogp_t = -A_b / N with N = 5 unmasked tokens:
    #   seq 0 (A = 2):  -2/5 = -0.4 on its 2 tokens, 0 on padding
    #   seq 1 (A = -1): +1/5 =  0.2 on its 3 tokens
    logp_B_T = torch.tensor([[-1.0, -0.5, -3.0], [-0.2, -1.1, -0.9]], requires_grad=True)
    mask_B_T = torch.tensor([[1, 1, 0], [1, 1, 1]])
    out = grpo_policy_loss(logp_B_T, logp_B_T.detach().clone(), torch.tensor([2.0, -1.0]), mask_B_T)
    out.loss.backward()
    _close(logp_B_T.grad, [[-0.4, -0.4, 0.0], [0.2, 0.2, 0.2]])


def test_kl_term_hand_computed() -> None:
    # On-policy with A = 1 on both tokens: pg_loss = -1.
    # k3 (see test_kl_k3_hand_computed) = [0.1065307, 0.7182818] -> mean 0.4124062
    # kl_coef 0.1: loss = -1 + 0.1 * 0.4124062 = -0.9587594
    # kl_coef 0:   loss = -1, kl_loss still reported as 0.4124062
    logp_B_T = torch.tensor([[-1.0, -2.0]])
    ref_B_T = torch.tensor([[-1.5, -1.0]])
    common = dict(advantages_B=torch.tensor([1.0]), mask_B_T=torch.ones(1, 2), ref_logprobs_B_T=ref_B_T)
    with_kl = grpo_policy_loss(logp_B_T, logp_B_T.clone(), kl_coef=0.1, **common)
    _close(with_kl.loss, -0.9587594)
    _close(with_kl.kl_loss, 0.4124062)
    without = grpo_policy_loss(logp_B_T, logp_B_T.clone(), kl_coef=0.0, **common)
    _close(without.loss, -1.0)
    _close(without.kl_loss, 0.4124062)


def test_fully_masked_batch_gives_zero_and_no_nan() -> None:
    # Garbage in padding (log-ratio 1e4, -inf reference) must not leak into
    # the loss or the gradient.
    logp_B_T = torch.tensor([[0.0, -1.0], [-2.0, 0.0]], requires_grad=True)
    behaviour_B_T = torch.full((2, 2), -1e4)
    ref_B_T = torch.full((2, 2), float("-inf"))
    out = grpo_policy_loss(
        logp_B_T, behaviour_B_T, torch.tensor([1.0, -1.0]), torch.zeros(2, 2),
        ref_logprobs_B_T=ref_B_T, kl_coef=0.1,
    )
    assert float(out.loss.detach()) == 0.0
    assert out.loss.requires_grad
    out.loss.backward()
    assert torch.equal(logp_B_T.grad, torch.zeros(2, 2))
    assert all(v == 0.0 for v in out.metrics().values())


def test_padding_garbage_does_not_leak_into_partial_batch() -> None:
    # Same as the on-policy case, plus a padded token with an overflowing ratio.
    # Only token 0 counts: pg_loss = -A = -1, grad = [-1, 0].
    logp_B_T = torch.tensor([[-1.0, 0.0]], requires_grad=True)
    behaviour_B_T = torch.tensor([[-1.0, -1e4]])
    out = grpo_policy_loss(logp_B_T, behaviour_B_T, torch.tensor([1.0]), torch.tensor([[1, 0]]))
    out.loss.backward()
    _close(out.loss, -1.0)
    _close(logp_B_T.grad, [[-1.0, 0.0]])


def test_micro_batched_loss_and_grads_sum_to_full_batch() -> None:
    gen = torch.Generator().manual_seed(0)
    behaviour_B_T = -torch.rand(4, 5, generator=gen) * 3
    logp_B_T = (behaviour_B_T + 0.3 * torch.randn(4, 5, generator=gen)).requires_grad_()
    ref_B_T = behaviour_B_T + 0.2 * torch.randn(4, 5, generator=gen)
    adv_B = torch.tensor([1.0, -0.5, 0.25, -2.0])
    mask_B_T = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    kw = dict(clip_low=0.2, clip_high=0.28, kl_coef=0.05)

    full = grpo_policy_loss(logp_B_T, behaviour_B_T, adv_B, mask_B_T, ref_logprobs_B_T=ref_B_T, **kw)
    (full_grad,) = torch.autograd.grad(full.loss, logp_B_T)

    n_tokens = float(mask_B_T.sum())  # 12
    parts = [
        grpo_policy_loss(
            logp_B_T[s], behaviour_B_T[s], adv_B[s], mask_B_T[s],
            ref_logprobs_B_T=ref_B_T[s], normalizer=n_tokens, **kw,
        )
        for s in (slice(0, 1), slice(1, 3), slice(3, 4))
    ]
    micro_loss = sum(p.loss for p in parts)
    (micro_grad,) = torch.autograd.grad(micro_loss, logp_B_T)

    torch.testing.assert_close(micro_loss, full.loss, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(micro_grad, full_grad, atol=1e-7, rtol=1e-6)
    # Metrics are each call's own token means: weighting by the micro-batch's
    # share of tokens (4, 7 and 1 of 12) recovers the full-batch means.
    shares = [4 / 12, 7 / 12, 1 / 12]
    for name, value in full.metrics().items():
        weighted = sum(p.metrics()[name] * w for p, w in zip(parts, shares))
        assert weighted == pytest.approx(value, abs=1e-6), name


def test_metrics_ignore_normalizer_loss_does_not() -> None:
    # Positive-advantage case from above (2 tokens): pg_loss metric = -1.1525855
    # and clipfrac = 0.5 whatever the normalizer; loss with normalizer 8 is the
    # token sum / 8 = (-1.1051709 - 1.2) / 8 = -0.2881464.
    behaviour_B_T = torch.tensor([[-1.0, -1.0]])
    logp_B_T = behaviour_B_T + torch.tensor([[0.1, 0.3]])
    out = grpo_policy_loss(logp_B_T, behaviour_B_T, torch.tensor([1.0]), torch.ones(1, 2), normalizer=8.0)
    _close(out.loss, -0.2881464)
    _close(out.pg_loss, -1.1525855)
    _close(out.pg_clipfrac, 0.5)


def test_behaviour_and_reference_are_constants() -> None:
    logp_B_T = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    behaviour_B_T = torch.tensor([[-1.1, -1.9]], requires_grad=True)
    ref_B_T = torch.tensor([[-1.5, -1.0]], requires_grad=True)
    out = grpo_policy_loss(
        logp_B_T, behaviour_B_T, torch.tensor([1.0]), torch.ones(1, 2), ref_logprobs_B_T=ref_B_T, kl_coef=0.1
    )
    out.loss.backward()
    assert logp_B_T.grad is not None
    assert behaviour_B_T.grad is None and ref_B_T.grad is None
    assert not out.pg_loss.requires_grad and not out.pg_clipfrac.requires_grad


def test_bf16_logprobs_computed_in_fp32() -> None:
    logp_B_T = torch.tensor([[-1.0, -2.0]], dtype=torch.bfloat16)
    out = grpo_policy_loss(logp_B_T, logp_B_T.clone(), torch.tensor([1.0]), torch.ones(1, 2))
    assert out.loss.dtype == torch.float32
    _close(out.loss, -1.0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(kl_coef=0.1), "ref_logprobs"),
        (dict(clip_low=1.0), "clip_low"),
        (dict(clip_high=-0.1), "clip_high"),
        (dict(advantages_B=torch.ones(2)), "advantages"),
        (dict(mask_B_T=torch.ones(1, 3)), "shape mismatch"),
    ],
)
def test_invalid_arguments_rejected(kwargs: dict, match: str) -> None:
    args = dict(
        logprobs_B_T=torch.zeros(1, 2),
        behaviour_logprobs_B_T=torch.zeros(1, 2),
        advantages_B=torch.ones(1),
        mask_B_T=torch.ones(1, 2),
    )
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        grpo_policy_loss(**args)


def test_log_ratio_constant_matches_exp_bound() -> None:
    # Guard against someone raising the clamp past float32's exp range (~88.7).
    from services.learner.loss import LOG_RATIO_CLAMP

    assert math.isfinite(math.exp(LOG_RATIO_CLAMP)) and LOG_RATIO_CLAMP < 88.0
