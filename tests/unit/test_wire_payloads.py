"""Token payloads cross the controller as they came off the wire: a group's token ids and log-probs
received from a rollout reach the learner's TrainRequest unchanged, without being copied into Python
lists on the way (converting them twice was ~a third of the controller's CPU per group in
bench/fleet_sim.py, issue 34), and still behave as the sequences the controller reads."""
from __future__ import annotations

import pytest

from controller.groups import ScoredGroup
from rlfleet.data.prompts import Prompt
from rlfleet.proto.v1 import learner_pb2, rollout_pb2
from rlfleet.rpc import convert
from rlfleet.types import Completion, GroupResult, ScoreResult, TrainBatch

pytestmark = pytest.mark.unit

IDS = [[5, 6, 7], [8, 9]]
LOGPROBS = [[-0.5, -0.25, -1.0], [-2.0, -0.125]]  # exact in float32


def _received() -> GroupResult:
    sent = GroupResult("p0-s0", [Completion(ids, lps, "stop", 3, text="x")
                                 for ids, lps in zip(IDS, LOGPROBS)])
    wire = convert.group_to_proto(sent).SerializeToString()
    return convert.group_from_proto(rollout_pb2.GroupResult.FromString(wire))


def test_received_payloads_read_as_the_sequences_sent():
    group = _received()
    for c, ids, lps in zip(group.completions, IDS, LOGPROBS):
        assert c.token_ids == ids and c.logprobs == lps
        assert len(c.token_ids) == len(ids) and c.token_ids[:2] == ids[:2] and bool(c.token_ids)


def test_received_payloads_are_not_copied_into_lists():
    group = _received()
    assert not any(isinstance(c.token_ids, list) or isinstance(c.logprobs, list) for c in group.completions)


def test_received_payloads_reach_the_train_request_unchanged():
    group = _received()
    prompt = Prompt(index=0, prompt_ids=[1, 2], text="q", ground_truth="7", data_source="d")
    scored = ScoredGroup(0, prompt, group.completions, [ScoreResult("a", 1.0), ScoreResult("b", 0.0)],
                         0.1, 0.0)
    batch = TrainBatch(step=1, samples=scored.train_samples(), expected_version=0)
    request = convert.train_batch_to_proto(batch)
    parsed = learner_pb2.TrainRequest.FromString(request.SerializeToString())
    assert [list(s.response_ids) for s in parsed.samples] == IDS
    assert [list(s.behaviour_logprobs) for s in parsed.samples] == LOGPROBS
    assert [list(s.prompt_ids) for s in parsed.samples] == [[1, 2], [1, 2]]
