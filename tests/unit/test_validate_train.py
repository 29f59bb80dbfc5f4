"""validate.train's checks of each sample (rlfleet/rpc/validate.py): made with whole-array operations
over the request (its prompt ids read once, convert.train_prompts_from_proto), yet each fault is still
named as the checks sample by sample named it: the first faulty sample, its field, the same words;
a sample staged at the learner (it names a payload) and one that carries its tokens alike."""
from __future__ import annotations

import math

import pytest

from rlfleet.errors import InvalidRequest
from rlfleet.proto.v1 import learner_pb2
from rlfleet.rpc import validate
from rlfleet.rpc.convert import train_prompts_from_proto
from rlfleet.security_config import LimitsConfig

pytestmark = pytest.mark.unit

VOCAB = 50
LIMITS = LimitsConfig()


def _inline(**fields) -> dict:
    return {"prompt_ids": [1, 2, 3], "response_ids": [4, 5], "behaviour_logprobs": [-0.5, -1.0],
            "advantage": 0.5, "generation_version": 2, "reward": 1.0, **fields}


def _staged(**fields) -> dict:
    return {"prompt_ids": [1, 2, 3], "advantage": -0.5, "generation_version": 2, "reward": 0.0,
            "payload": learner_pb2.PayloadRef(address="10.0.0.1:7001", request_id="p0-s0", sample=0),
            **fields}


def _request(*samples: dict) -> learner_pb2.TrainRequest:
    return learner_pb2.TrainRequest(step=1, temperature=1.0, expected_version=2,
                                    samples=[learner_pb2.TrainSample(**s) for s in samples])


def test_good_samples_of_both_kinds_pass_with_or_without_the_prompts_read_beforehand():
    request = _request(_staged(), _inline(), _staged(prompt_ids=[0, VOCAB - 1]), _inline(loss_mask=[1, 0]))
    validate.train(request, LIMITS, VOCAB)
    validate.train(request, LIMITS, VOCAB, train_prompts_from_proto(request))
    validate.train(_request(_staged(prompt_ids=[10 ** 6])), LIMITS, None)  # no vocabulary: no upper bound


BAD = [  # (a faulty sample, the message naming it at index 1)
    (_staged(prompt_ids=[]), "sample 1: prompt_ids is empty"),
    (_inline(prompt_ids=[]), "sample 1: prompt_ids is empty"),
    (_staged(prompt_ids=[1, VOCAB]), r"sample 1: prompt_ids has token ids outside \[0, 50\)"),
    (_staged(prompt_ids=[-1, 2]), r"sample 1: prompt_ids has token ids outside \[0, 50\)"),
    (_inline(prompt_ids=[VOCAB + 3]), r"sample 1: prompt_ids has token ids outside \[0, 50\)"),
    (_staged(response_ids=[4]), "sample 1: names a payload and also carries response tokens"),
    (_staged(behaviour_logprobs=[-1.0]), "sample 1: names a payload and also carries response tokens"),
    (_inline(response_ids=[], behaviour_logprobs=[]), "sample 1: response_ids is empty"),
    (_inline(behaviour_logprobs=[-1.0]), "sample 1: 1 behaviour_logprobs for 2 response tokens"),
    (_inline(response_ids=[4, VOCAB]), r"sample 1: response_ids has token ids outside \[0, 50\)"),
    (_inline(behaviour_logprobs=[-1.0, math.nan]), "sample 1: behaviour_logprobs must be finite"),
    (_inline(loss_mask=[1]), "sample 1: 1 loss_mask entries for 2 response tokens"),
    (_inline(loss_mask=[1, 2]), "sample 1: loss_mask entries must be 0 or 1"),
    (_staged(advantage=math.inf), "sample 1: advantage must be a finite number"),
    (_inline(advantage=math.nan), "sample 1: advantage must be a finite number"),
    (_staged(reward=-math.inf), "sample 1: reward must be a finite number"),
    (_staged(generation_version=-1), "sample 1: generation_version must be >= 0, got -1"),
    (_inline(generation_version=-3), "sample 1: generation_version must be >= 0, got -3"),
]


@pytest.mark.parametrize(("bad", "message"), BAD, ids=[m for _, m in BAD])
def test_each_fault_is_named_with_its_sample_and_field(bad, message):
    request = _request(_staged(), bad, _inline())
    with pytest.raises(InvalidRequest, match=message):
        validate.train(request, LIMITS, VOCAB)
    with pytest.raises(InvalidRequest, match=message):  # the prompts read beforehand, as the servicer does
        validate.train(request, LIMITS, VOCAB, train_prompts_from_proto(request))


def test_of_several_faults_the_first_sample_is_named_and_its_first_field():
    # sample 1's prompt is out of range and its reward infinite, sample 2's prompt empty: as the checks
    # sample by sample, the first sample at fault is named, by its first check that fails
    request = _request(_inline(), _staged(prompt_ids=[VOCAB], reward=math.inf), _staged(prompt_ids=[]))
    with pytest.raises(InvalidRequest, match=r"sample 1: prompt_ids has token ids outside"):
        validate.train(request, LIMITS, VOCAB)
    request = _request(_staged(), _staged(advantage=math.nan), _inline(response_ids=[99, 1]))
    with pytest.raises(InvalidRequest, match="sample 1: advantage must be a finite number"):
        validate.train(request, LIMITS, VOCAB)
