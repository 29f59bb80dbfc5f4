"""Micro-batching for the learner: token-budget packing, collate alignment, validation."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from rlfleet.errors import InvalidRequest, RequestTooLarge
from rlfleet.types import TrainBatch, TrainSample
from services.learner.batching import collate, split_by_token_budget, validate_samples
from services.learner.step_results import fingerprint

pytestmark = pytest.mark.unit


def sample(P: int, R: int, advantage: float = 0.0, first: int = 10) -> TrainSample:
    return TrainSample(prompt_ids=list(range(first, first + P)),
                       response_ids=list(range(first + P, first + P + R)),
                       behaviour_logprobs=[-0.5] * R, advantage=advantage, generation_version=0)


def lengths(batches: list[list[TrainSample]]) -> list[list[int]]:
    return [[len(s.prompt_ids) + len(s.response_ids) for s in mb] for mb in batches]


def test_split_packs_greedily_by_padded_size():
    # Lengths 3, 5, 2, 4, 10 with a budget of 10 (rows x longest row):
    #   [3] -> +5: 2 x 5 = 10 fits -> +2: 3 x 5 = 15 no -> flush [3, 5]
    #   [2] -> +4: 2 x 4 = 8 fits  -> +10: 3 x 10 = 30 no -> flush [2, 4]
    #   [10] alone (10 = budget fits).
    samples = [sample(1, 2), sample(2, 3), sample(1, 1), sample(2, 2), sample(4, 6)]
    batches = split_by_token_budget(samples, budget_tokens=10)
    assert lengths(batches) == [[3, 5], [2, 4], [10]]
    assert [s for mb in batches for s in mb] == samples  # order kept, nothing lost


def test_split_keeps_everything_in_one_batch_when_it_fits():
    samples = [sample(2, 2)] * 4  # 4 rows x 4 = 16
    assert lengths(split_by_token_budget(samples, budget_tokens=16)) == [[4, 4, 4, 4]]
    assert lengths(split_by_token_budget(samples, budget_tokens=15)) == [[4, 4, 4], [4]]


def test_sample_larger_than_budget_gets_its_own_micro_batch():
    samples = [sample(1, 1), sample(5, 7), sample(1, 1)]  # lengths 2, 12, 2; budget 10
    assert lengths(split_by_token_budget(samples, budget_tokens=10)) == [[2], [12], [2]]
    assert lengths(split_by_token_budget([sample(5, 7)], budget_tokens=1)) == [[12]]


def test_split_of_nothing_is_nothing():
    assert split_by_token_budget([], budget_tokens=10) == []


def test_collate_aligns_response_mask_logprobs_and_targets():
    # Row 0: prompt [5, 6, 7] (P=3), response [8, 9] (R=2): L_0 = 5.
    # Row 1: prompt [5] (P=1), response [10, 11, 12] (R=3): L_1 = 4, padded to L = 5 with 0.
    # Position t predicts token t + 1, so response token j (at P + j) is predicted at P + j - 1:
    # row 0 uses positions 2..3, row 1 positions 0..2. T = L - 1 = 4.
    a = TrainSample([5, 6, 7], [8, 9], [-0.1, -0.2], advantage=1.5, generation_version=0)
    b = TrainSample([5], [10, 11, 12], [-1.0, -2.0, -3.0], advantage=-0.5, generation_version=0)
    mb = collate([a, b], pad_id=0, device=torch.device("cpu"))

    assert mb.input_ids_B_L.tolist() == [[5, 6, 7, 8, 9], [5, 10, 11, 12, 0]]
    assert mb.attention_mask_B_L.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    assert mb.targets_B_T.tolist() == [[6, 7, 8, 9], [10, 11, 12, 0]]
    assert mb.response_mask_B_T.tolist() == [[0, 0, 1, 1], [1, 1, 1, 0]]
    torch.testing.assert_close(mb.behaviour_logprobs_B_T, torch.tensor([[0, 0, -0.1, -0.2], [-1, -2, -3, 0]]))
    assert mb.advantages_B.tolist() == [1.5, -0.5]
    assert mb.num_tokens == 5
    # The masked targets are exactly the response ids, in order.
    for row, s in enumerate([a, b]):
        mask = mb.response_mask_B_T[row].bool()
        assert mb.targets_B_T[row][mask].tolist() == s.response_ids
        assert mb.behaviour_logprobs_B_T[row][mask].tolist() == pytest.approx(s.behaviour_logprobs)


@pytest.mark.parametrize("P, R", [(1, 1), (4, 1), (1, 4), (3, 3)])
def test_collate_alignment_general(P, R):
    s = sample(P, R)
    padding_row = sample(P + R + 2, 1, first=40)  # makes the batch longer than s
    mb = collate([s, padding_row], pad_id=3, device=torch.device("cpu"))
    positions = mb.response_mask_B_T[0].nonzero().flatten().tolist()
    assert positions == list(range(P - 1, P + R - 1))
    assert mb.targets_B_T[0, P - 1:P + R - 1].tolist() == s.response_ids
    assert mb.response_mask_B_T.dtype == torch.float32
    assert mb.input_ids_B_L.dtype == torch.long


def test_validate_accepts_good_samples():
    validate_samples([sample(3, 2), sample(1, 1)], max_seq_len=5)
    validate_samples([sample(300, 300)])  # no length limit


def test_validate_rejects_empty_batch():
    with pytest.raises(InvalidRequest, match="no samples"):
        validate_samples([])


def test_validate_rejects_logprob_count_mismatch():
    bad = TrainSample([1, 2], [3, 4, 5], [-0.1, -0.2], advantage=0.0, generation_version=0)
    with pytest.raises(InvalidRequest, match=r"sample 1: 2 behaviour_logprobs for 3 response tokens"):
        validate_samples([sample(1, 1), bad])


@pytest.mark.parametrize("P, R, what", [(0, 2, "prompt_ids"), (2, 0, "response_ids")])
def test_validate_rejects_empty_parts(P, R, what):
    with pytest.raises(InvalidRequest, match=what):
        validate_samples([sample(P, R)])


def test_validate_rejects_too_long_sample():
    with pytest.raises(RequestTooLarge, match=r"sample 0: 7 tokens exceed the model's 6"):
        validate_samples([sample(4, 3)], max_seq_len=6)
    assert issubclass(RequestTooLarge, ValueError)
    assert RequestTooLarge.grpc_code == "RESOURCE_EXHAUSTED"


def test_numpy_columns_build_the_same_tensors_and_fingerprint_as_lists():
    """The data plane hands the learner each sample's ids and log-probs as numpy views (int32, float32:
    rlfleet/dataplane/columns.py), the inline path as Python lists: the same micro-batch, bit for bit,
    and the same step fingerprint (a retried Train is recognised whichever path it came by)."""
    lists = [TrainSample([3, 4, 5], [6, 7, 8, 9], [-0.5, -0.25, -1.125, -3.0], 0.5, 1,
                         loss_mask=[1, 0, 1, 1]),
             TrainSample([3], [11, 12], [-0.75, -2.5], -1.0, 1, reward=1.0)]
    columns = [replace(s, response_ids=np.asarray(s.response_ids, np.int32),
                       behaviour_logprobs=np.asarray(s.behaviour_logprobs, np.float32)) for s in lists]
    validate_samples(columns)
    a = collate(lists, pad_id=0, device=torch.device("cpu"), pack=True)
    b = collate(columns, pad_id=0, device=torch.device("cpu"), pack=True)
    for field in ("input_ids_B_L", "attention_mask_B_L", "targets_B_T", "response_mask_B_T",
                  "behaviour_logprobs_B_T", "advantages_B", "rewards_B"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field
        assert getattr(a, field).dtype == getattr(b, field).dtype, field
    for field in ("input_ids_R_C", "position_ids_R_C", "index_B_T"):
        assert torch.equal(getattr(a.packed, field), getattr(b.packed, field)), field
    assert a.num_tokens == b.num_tokens == 5
    assert fingerprint(TrainBatch(1, lists, 1.0, 0)) == fingerprint(TrainBatch(1, columns, 1.0, 0))
