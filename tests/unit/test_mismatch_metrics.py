"""Training-inference mismatch (services/learner/loss.mismatch_stats): the learner's and the rollout's
log-probs of the same trained tokens, numbers derived by hand."""
from __future__ import annotations

import math

import pytest
import torch

from services.learner.loss import mismatch_stats


def test_mismatch_by_hand() -> None:
    # log pi_learner - log pi_rollout per token: 0, ln 3, -ln 2 - 0.1, and a masked token of +5 (not counted)
    rollout_B_T = torch.tensor([[-1.0, -2.0, -0.5, -3.0]])
    learner_B_T = rollout_B_T + torch.tensor([[0.0, math.log(3.0), -math.log(2.0) - 0.1, 5.0]])
    mask_B_T = torch.tensor([[1, 1, 1, 0]])
    stats = mismatch_stats(learner_B_T, rollout_B_T, mask_B_T)
    diffs = [0.0, math.log(3.0), math.log(2.0) + 0.1]
    assert stats["mismatch/abs_logprob_diff_mean"].item() == pytest.approx(sum(diffs) / 3)
    assert stats["mismatch/abs_logprob_diff_max"].item() == pytest.approx(math.log(3.0))
    # ratio pi_learner / pi_rollout: 1, 3, 0.5 * e^-0.1 = 0.4524: two of three beyond a factor of 2
    assert stats["mismatch/ratio_over_2"].item() == pytest.approx(2 / 3)
    # k3 estimate of KL(rollout || learner), r - 1 - ln r per sampled token: 0; 3 - 1 - ln 3 = 0.9014;
    # 0.4524 - 1 + 0.7931 = 0.2455; mean 0.3823
    r = 0.5 * math.exp(-0.1)
    expected = (0.0 + (2.0 - math.log(3.0)) + (r - 1.0 - math.log(r))) / 3
    assert stats["mismatch/kl"].item() == pytest.approx(expected)
    assert expected == pytest.approx(0.3823, abs=1e-4)


def test_identical_logprobs_have_no_mismatch_and_a_fully_masked_batch_gives_zeros() -> None:
    lp_B_T = torch.tensor([[-0.3, -1.2], [-2.0, -0.01]])
    stats = mismatch_stats(lp_B_T, lp_B_T.clone(), torch.ones(2, 2))
    assert all(v.item() == 0.0 for v in stats.values())
    stats = mismatch_stats(lp_B_T + 1.0, lp_B_T, torch.zeros(2, 2))
    assert all(v.item() == 0.0 for v in stats.values())
