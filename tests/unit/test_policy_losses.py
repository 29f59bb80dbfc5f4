"""Policy losses (PPO clip with clip-higher and dual clip, GSPO) inside the micro-batch objective,
with expected values derived by hand in the comments.

Notation: r = exp(logp - logp_old), A = advantage, pg = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high)),
aggregated token-mean unless a test says otherwise.
"""
from __future__ import annotations

import math

import pytest
import torch

from rlfleet.extensions import LOSS_AGGREGATIONS, OFF_POLICY
from services.learner.algorithms.aggregation import BatchCounts
from services.learner.algorithms.objective import ObjectiveSettings, micro_batch_objective
from services.learner.algorithms.policy_losses import ClipSettings

pytestmark = pytest.mark.unit


def _close(actual, expected, atol: float = 1e-6) -> None:
    torch.testing.assert_close(torch.as_tensor(actual, dtype=torch.float32), torch.tensor(expected),
                               atol=atol, rtol=0)


def objective(logp_B_T, old_B_T, adv_B, mask_B_T, *, clip=None, policy_loss="ppo_clip",
              agg="token-mean", counts=None, loss_scale_tokens=1, ref_B_T=None, kl_coef=0.0,
              kl_estimator="k3",
              entropy_B_T=None, entropy_coef=0.0):
    mask_B_T = torch.as_tensor(mask_B_T)
    counts = counts or BatchCounts.of([mask_B_T], loss_scale_tokens)
    weights_B_T = LOSS_AGGREGATIONS.get(agg)(mask_B_T, counts)
    correction = OFF_POLICY.get("none").apply(old_B_T, None, mask_B_T, 2.0)
    settings = ObjectiveSettings(policy_loss, clip or ClipSettings(), kl_coef, kl_estimator, entropy_coef)
    return micro_batch_objective(logp_B_T, adv_B.unsqueeze(-1).expand(logp_B_T.shape), mask_B_T, weights_B_T,
                                 correction, settings, ref_logprobs_B_T=ref_B_T, entropy_B_T=entropy_B_T)


# --------------------------------------------------------------------------- ppo_clip


def test_on_policy_pg_loss_is_minus_mean_advantage() -> None:
    # On-policy r = 1 everywhere, never clipped, so pg = -A per token.
    # Tokens: three of sequence 0 (A = 1.0), one of sequence 1 (A = -0.5)
    # pg_loss = -(1 + 1 + 1 - 0.5) / 4 = -2.5 / 4 = -0.625
    logp_B_T = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -9.0, -9.0]])
    out = objective(logp_B_T, logp_B_T.clone(), torch.tensor([1.0, -0.5]), [[1, 1, 1], [1, 0, 0]])
    _close(out.loss, -0.625)
    m = {k: float(v) for k, v in out.metrics.items()}
    assert m == pytest.approx({"actor/pg_loss": -0.625, "actor/pg_clipfrac": 0.0,
                               "actor/pg_clipfrac_lower": 0.0,
                               "actor/ratio_mean": 1.0, "actor/ppo_kl": 0.0, "actor/is_ratio_mean": 1.0,
                               "actor/is_clipfrac": 0.0, "actor/kl_loss": 0.0})


def test_positive_advantage_clipped_above_one_plus_clip_high() -> None:
    # A = +1, clip 0.2 -> bounds [0.8, 1.2]
    #   token 0: log r = 0.1 -> r = e^0.1 = 1.1051709 <= 1.2, unclipped: pg = -1.1051709
    #   token 1: log r = 0.3 -> r = e^0.3 = 1.3498588 >  1.2: max(-1.3498588, -1.2) = -1.2 -> clipped
    # pg_loss = (-1.1051709 - 1.2) / 2 = -1.1525855 ; clipfrac = 1/2 ; ratio_mean = 1.2275149
    # grads: token 0: d(-A r / 2)/dlogp = -A r / 2 = -0.5525855 ; token 1: 0 (clipped)
    old_B_T = torch.tensor([[-1.0, -1.0]])
    logp_B_T = (old_B_T + torch.tensor([[0.1, 0.3]])).requires_grad_()
    out = objective(logp_B_T, old_B_T, torch.tensor([1.0]), torch.ones(1, 2))
    _close(out.metrics["actor/pg_loss"], -1.1525855)
    _close(out.metrics["actor/pg_clipfrac"], 0.5)
    _close(out.metrics["actor/ratio_mean"], 1.2275149)
    out.loss.backward()
    _close(logp_B_T.grad, [[-0.5525855, 0.0]])


def test_negative_advantage_clipped_below_one_minus_clip_low() -> None:
    # A = -1, bounds [0.8, 1.2]
    #   token 0: log r = -0.1 -> r = 0.9048374 >= 0.8, unclipped: pg = 0.9048374
    #   token 1: log r = -0.3 -> r = 0.7408182 <  0.8: max(0.7408182, 0.8) = 0.8 -> clipped
    # pg_loss = (0.9048374 + 0.8) / 2 = 0.8524187 ; grads: token 0: -A r / 2 = 0.4524187 ; token 1: 0
    old_B_T = torch.tensor([[-2.0, -2.0]])
    logp_B_T = (old_B_T + torch.tensor([[-0.1, -0.3]])).requires_grad_()
    out = objective(logp_B_T, old_B_T, torch.tensor([-1.0]), torch.ones(1, 2))
    _close(out.metrics["actor/pg_loss"], 0.8524187)
    _close(out.metrics["actor/pg_clipfrac"], 0.5)
    out.loss.backward()
    _close(logp_B_T.grad, [[0.4524187, 0.0]])


def test_clip_is_pessimistic_only() -> None:
    # seq 0: A = +1, r = e^-0.3 = 0.7408182 < 0.8: max(-0.7408182, -0.8) = -0.7408182, unclipped
    # seq 1: A = -1, r = e^+0.3 = 1.3498588 > 1.2: max(1.3498588, 1.2)   =  1.3498588, unclipped
    # pg_loss = (-0.7408182 + 1.3498588) / 2 = 0.3045203 ; clipfrac = 0
    old_B_T = torch.tensor([[-1.0], [-1.0]])
    out = objective(old_B_T + torch.tensor([[-0.3], [0.3]]), old_B_T, torch.tensor([1.0, -1.0]),
                    torch.ones(2, 1))
    _close(out.metrics["actor/pg_loss"], 0.3045203)
    _close(out.metrics["actor/pg_clipfrac"], 0.0)


def test_clip_higher_asymmetric_bounds() -> None:
    # DAPO clip-higher: clip_low = 0.1, clip_high = 0.3 -> bounds [0.9, 1.3]
    #   seq 0: A = +1, r = e^0.25 = 1.2840254 <= 1.3 -> unclipped, pg = -1.2840254
    #   seq 1: A = -1, r = e^-0.15 = 0.8607080 < 0.9 -> clipped, pg = max(0.8607080, 0.9) = 0.9
    # pg_loss = (-1.2840254 + 0.9) / 2 = -0.1920127 ; clipfrac 1/2
    # Symmetric 0.2: seq 0 clipped at 1.2, seq 1 unclipped: (-1.2 + 0.8607080) / 2 = -0.1696460
    old_B_T = torch.tensor([[-1.0], [-1.0]])
    logp_B_T = old_B_T + torch.tensor([[0.25], [-0.15]])
    adv_B = torch.tensor([1.0, -1.0])
    out = objective(logp_B_T, old_B_T, adv_B, torch.ones(2, 1), clip=ClipSettings(0.1, 0.3))
    _close(out.metrics["actor/pg_loss"], -0.1920127)
    _close(out.metrics["actor/pg_clipfrac"], 0.5)
    _close(objective(logp_B_T, old_B_T, adv_B, torch.ones(2, 1)).metrics["actor/pg_loss"], -0.1696460)


def test_dual_clip_bounds_negative_advantage_loss() -> None:
    # clip 0.2, clip_ratio_c = 3; one token per sequence:
    #   seq 0: A = -1, r = 4: max(4, 1.2) = 4 > -A c = 3 -> dual clipped: pg = 3, grad 0
    #   seq 1: A = -1, r = 2: max(2, 1.2) = 2 <= 3        -> pg = 2, grad -A r / 3 = 2/3
    #   seq 2: A = +1, r = 4: max(-4, -1.2) = -1.2 (ordinary clip; dual clip is for A < 0 only), grad 0
    # pg_loss = (3 + 2 - 1.2) / 3 = 1.2666667 ; clipfrac = 1/3 (seq 2) ; clipfrac_lower = 1/3 (seq 0)
    old_B_T = torch.zeros(3, 1)
    logp_B_T = torch.log(torch.tensor([[4.0], [2.0], [4.0]])).requires_grad_()
    out = objective(logp_B_T, old_B_T, torch.tensor([-1.0, -1.0, 1.0]), torch.ones(3, 1),
                    clip=ClipSettings(0.2, 0.2, clip_ratio_c=3.0))
    _close(out.loss, 1.2666667)
    _close(out.metrics["actor/pg_clipfrac"], 1 / 3)
    _close(out.metrics["actor/pg_clipfrac_lower"], 1 / 3)
    out.loss.backward()
    _close(logp_B_T.grad, [[0.0], [2 / 3], [0.0]])
    # Without the dual clip seq 0 costs 4: (4 + 2 - 1.2) / 3 = 1.6
    _close(objective(logp_B_T, old_B_T, torch.tensor([-1.0, -1.0, 1.0]), torch.ones(3, 1)).loss, 1.6)


def test_on_policy_gradient_is_minus_advantage_over_token_count() -> None:
    # dloss/dlogp_t = -A_b / N with N = 5: seq 0 (A = 2): -0.4 ; seq 1 (A = -1): +0.2
    logp_B_T = torch.tensor([[-1.0, -0.5, -3.0], [-0.2, -1.1, -0.9]], requires_grad=True)
    out = objective(logp_B_T, logp_B_T.detach().clone(), torch.tensor([2.0, -1.0]), [[1, 1, 0], [1, 1, 1]])
    out.loss.backward()
    _close(logp_B_T.grad, [[-0.4, -0.4, 0.0], [0.2, 0.2, 0.2]])


# --------------------------------------------------------------------------- gspo


def test_gspo_clips_whole_sequences_on_the_mean_log_ratio() -> None:
    # clip 0.2 -> [0.8, 1.2], A = +1 for both sequences of two tokens, seq-mean-token-mean (S = 2, n_b = 2):
    #   seq 0: log ratios [0.1, 0.3], mean 0.2 -> s = e^0.2 = 1.2214028 > 1.2 -> clipped: pg = -1.2, grad 0
    #   seq 1: log ratios [0.3, -0.1], mean 0.1 -> s = e^0.1 = 1.1051709 -> unclipped: pg = -1.1051709
    #          (token-level PPO would have clipped its first token at 1.3498588 > 1.2)
    # loss = (-1.2 + -1.1051709) / 2 = -1.1525855
    # grad: d s_bt / d logp_bt = s_b, weight 1 / (S n_b) = 1/4 -> seq 1 tokens: -1.1051709 / 4 = -0.2762927
    old_B_T = torch.full((2, 2), -1.0)
    logp_B_T = (old_B_T + torch.tensor([[0.1, 0.3], [0.3, -0.1]])).requires_grad_()
    out = objective(logp_B_T, old_B_T, torch.tensor([1.0, 1.0]), torch.ones(2, 2), policy_loss="gspo",
                    agg="seq-mean-token-mean")
    _close(out.loss, -1.1525855)
    _close(out.metrics["actor/pg_clipfrac"], 0.5)
    _close(out.metrics["actor/ratio_mean"], (1.2214028 + 1.1051709) / 2)
    out.loss.backward()
    _close(logp_B_T.grad, [[0.0, 0.0], [-0.2762927, -0.2762927]])


def test_gspo_ignores_padding_in_the_sequence_mean() -> None:
    # One sequence, tokens [0.2, <pad: log ratio 50>]: mean over the one real token = 0.2 -> s = 1.2214028,
    # unclipped with clip_high 0.3 and A = 1: loss = -1.2214028 (the pad's 50 would overflow exp otherwise).
    old_B_T = torch.tensor([[-1.0, -60.0]])
    logp_B_T = torch.tensor([[-0.8, -10.0]])
    out = objective(logp_B_T, old_B_T, torch.tensor([1.0]), [[1, 0]], policy_loss="gspo",
                    clip=ClipSettings(0.2, 0.3))
    _close(out.loss, -1.2214028)


# --------------------------------------------------------------------------- KL term and entropy bonus


def test_kl_loss_term_k3_and_k2() -> None:
    # On-policy, A = 1 on both tokens: pg_loss = -1. logp = [-1, -2], ref = [-1.5, -1] -> d = logp - ref =
    # [0.5, -1] k3 = [0.1065307, 0.7182818], mean 0.4124062 -> loss = -1 + 0.1 * 0.4124062 = -0.9587594
    # k2 = d^2 / 2 = [0.125, 0.5], mean 0.3125   -> loss = -1 + 0.1 * 0.3125    = -0.96875
    #   k2 grad: pg -A / N = -0.5 per token, plus 0.1 * d / N = [0.025, -0.05] -> [-0.475, -0.55]
    logp_B_T = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    ref_B_T = torch.tensor([[-1.5, -1.0]])
    common = {"adv_B": torch.tensor([1.0]), "mask_B_T": torch.ones(1, 2), "ref_B_T": ref_B_T, "kl_coef": 0.1}
    k3 = objective(logp_B_T, logp_B_T.detach().clone(), **common)
    _close(k3.loss, -0.9587594)
    _close(k3.metrics["actor/kl_loss"], 0.4124062)
    k2 = objective(logp_B_T, logp_B_T.detach().clone(), kl_estimator="k2", **common)
    _close(k2.loss, -0.96875)
    k2.loss.backward()
    _close(logp_B_T.grad, [[-0.475, -0.55]])


def test_kl_reported_but_not_trained_at_zero_coef() -> None:
    logp_B_T = torch.tensor([[-1.0, -2.0]])
    out = objective(logp_B_T, logp_B_T.clone(), torch.tensor([1.0]), torch.ones(1, 2),
                    ref_B_T=torch.tensor([[-1.5, -1.0]]))
    _close(out.loss, -1.0)
    _close(out.metrics["actor/kl_loss"], 0.4124062)


def test_entropy_bonus() -> None:
    # A = 0 so pg = 0; entropy [1, 2], coef 0.01, token-mean: loss = -0.01 * 1.5 = -0.015,
    # d loss / d H_t = -0.01 / 2 = -0.005
    logp_B_T = torch.tensor([[-1.0, -2.0]])
    entropy_B_T = torch.tensor([[1.0, 2.0]], requires_grad=True)
    out = objective(logp_B_T, logp_B_T.clone(), torch.tensor([0.0]), torch.ones(1, 2),
                    entropy_B_T=entropy_B_T,
                    entropy_coef=0.01)
    _close(out.loss, -0.015)
    _close(out.metrics["actor/entropy"], 1.5)
    out.loss.backward()
    _close(entropy_B_T.grad, [[-0.005, -0.005]])


# --------------------------------------------------------------------------- masking and micro-batches


def test_fully_masked_batch_gives_zero_and_no_nan() -> None:
    # Garbage in padding (log-ratio 1e4, -inf reference) must not leak into the loss or the gradient.
    logp_B_T = torch.tensor([[0.0, -1.0], [-2.0, 0.0]], requires_grad=True)
    for policy_loss in ("ppo_clip", "gspo"):
        out = objective(logp_B_T, torch.full((2, 2), -1e4), torch.tensor([1.0, -1.0]), torch.zeros(2, 2),
                        policy_loss=policy_loss, ref_B_T=torch.full((2, 2), float("-inf")), kl_coef=0.1)
        assert float(out.loss.detach()) == 0.0 and out.loss.requires_grad
        (grad,) = torch.autograd.grad(out.loss, logp_B_T)
        assert torch.equal(grad, torch.zeros(2, 2))
        assert all(math.isfinite(float(v)) for v in out.metrics.values())


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                                 "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("policy_loss", ["ppo_clip", "gspo"])
def test_micro_batched_loss_and_grads_sum_to_full_batch(agg: str, policy_loss: str) -> None:
    gen = torch.Generator().manual_seed(0)
    old_B_T = -torch.rand(4, 5, generator=gen) * 3
    logp_B_T = (old_B_T + 0.3 * torch.randn(4, 5, generator=gen)).requires_grad_()
    ref_B_T = old_B_T + 0.2 * torch.randn(4, 5, generator=gen)
    adv_B = torch.tensor([1.0, -0.5, 0.25, -2.0])
    mask_B_T = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    counts = BatchCounts.of([mask_B_T], loss_scale_tokens=6)
    kw = {"clip": ClipSettings(0.2, 0.28, 3.0), "kl_coef": 0.05, "agg": agg, "counts": counts,
          "policy_loss": policy_loss}
    full = objective(logp_B_T, old_B_T, adv_B, mask_B_T, ref_B_T=ref_B_T, **kw)
    (full_grad,) = torch.autograd.grad(full.loss, logp_B_T)
    parts = [objective(logp_B_T[s], old_B_T[s], adv_B[s], mask_B_T[s], ref_B_T=ref_B_T[s], **kw)
             for s in (slice(0, 1), slice(1, 3), slice(3, 4))]
    micro_loss = sum(p.loss for p in parts)
    (micro_grad,) = torch.autograd.grad(micro_loss, logp_B_T)
    torch.testing.assert_close(micro_loss, full.loss, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(micro_grad, full_grad, atol=1e-7, rtol=1e-6)
    # Metrics are each call's own token means: weighting by the micro-batch's share of tokens
    # (4, 7 and 1 of 12) recovers the full-batch means.
    for name, value in full.metrics.items():
        weighted = sum(float(p.metrics[name]) * w for p, w in zip(parts, [4 / 12, 7 / 12, 1 / 12]))
        assert weighted == pytest.approx(float(value), abs=1e-6), name


def test_old_and_reference_are_constants_and_bf16_is_upcast() -> None:
    logp_B_T = torch.tensor([[-1.0, -2.0]], dtype=torch.bfloat16, requires_grad=True)
    old_B_T = torch.tensor([[-1.1, -1.9]], requires_grad=True)
    ref_B_T = torch.tensor([[-1.5, -1.0]], requires_grad=True)
    out = objective(logp_B_T, old_B_T, torch.tensor([1.0]), torch.ones(1, 2), ref_B_T=ref_B_T, kl_coef=0.1)
    assert out.loss.dtype == torch.float32
    out.loss.backward()
    assert logp_B_T.grad is not None and old_B_T.grad is None and ref_B_T.grad is None
    assert not any(v.requires_grad for v in out.metrics.values())


@pytest.mark.parametrize(("kwargs", "match"),
                         [({"clip_low": 1.0}, "clip_low"), ({"clip_high": -0.1}, "clip_high"),
                                               ({"clip_ratio_c": 1.0}, "clip_ratio_c")])
def test_invalid_clip_settings_rejected(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ClipSettings(**kwargs)


def test_kl_coef_without_reference_rejected() -> None:
    with pytest.raises(ValueError, match="ref_logprobs"):
        objective(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1), torch.ones(1, 2), kl_coef=0.1)
