"""Loss aggregation modes, values derived by hand.

values (row 2 fully masked; padding holds NaN / 9 to prove it never counts):
    row 0: [1, 2, 3, pad]   n_0 = 3, sum 6
    row 1: [4, pad, pad, pad] n_1 = 1, sum 4
    row 2: [pad x 4]        not a sequence
N = 4 tokens, S = 2 sequences.
"""
from __future__ import annotations

import pytest
import torch

from rlfleet.extensions import LOSS_AGGREGATIONS
from services.learner.algorithms.aggregation import BatchCounts, weighted_sum

pytestmark = pytest.mark.unit

NAN = float("nan")
VALUES_B_T = torch.tensor([[1.0, 2.0, 3.0, NAN], [4.0, 9.0, 9.0, NAN], [NAN, 9.0, 9.0, 9.0]])
MASK_B_T = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])


def aggregate(mode: str, values_B_T=VALUES_B_T, mask_B_T=MASK_B_T, counts=None) -> float:
    counts = counts or BatchCounts.of([MASK_B_T], loss_scale_tokens=4)
    return float(weighted_sum(values_B_T, mask_B_T, LOSS_AGGREGATIONS.get(mode)(mask_B_T, counts)))


def test_counts_skip_fully_masked_rows() -> None:
    assert BatchCounts.of([MASK_B_T], 4) == BatchCounts(num_tokens=4, num_sequences=2, loss_scale_tokens=4)


@pytest.mark.parametrize(("mode", "expected"), [
    ("token-mean", 2.5),                # (1 + 2 + 3 + 4) / 4
    ("seq-mean-token-sum", 5.0),        # (6 + 4) / 2
    ("seq-mean-token-mean", 3.0),       # (6/3 + 4/1) / 2 = (2 + 4) / 2
    ("seq-mean-token-sum-norm", 1.25),  # (6 + 4) / (2 * 4), L = 4
])
def test_modes_hand_computed(mode: str, expected: float) -> None:
    assert aggregate(mode) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                                  "seq-mean-token-sum-norm"])
def test_micro_batches_sum_to_the_whole(mode: str) -> None:
    # Rows split as [0] and [1, 2], each weighted with the whole batch's counts.
    counts = BatchCounts.of([MASK_B_T], loss_scale_tokens=4)
    parts = aggregate(mode, VALUES_B_T[:1], MASK_B_T[:1],
                      counts) + aggregate(mode, VALUES_B_T[1:], MASK_B_T[1:],
                                                                              counts)
    assert parts == pytest.approx(aggregate(mode), abs=1e-6)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                                  "seq-mean-token-sum-norm"])
def test_fully_masked_batch_is_zero(mode: str) -> None:
    mask_B_T = torch.zeros(2, 3)
    counts = BatchCounts.of([mask_B_T], 4)
    assert counts == BatchCounts(0, 0, 4)
    assert float(weighted_sum(torch.full((2, 3), NAN), mask_B_T,
                              LOSS_AGGREGATIONS.get(mode)(mask_B_T, counts))) == 0.0


def test_token_mean_weighs_long_sequences_more_than_seq_mean_token_mean() -> None:
    # The long row 0 has mean 2, the short row 1 has 4: token-mean 2.5 leans to row 0, the
    # per-sequence mean 3.0 sits halfway; that is the length bias the modes trade.
    assert aggregate("token-mean") < aggregate("seq-mean-token-mean")
