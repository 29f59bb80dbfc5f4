"""The learner's staging store (rlfleet/dataplane/staging.py) and the Train batch it fills
(rlfleet/dataplane/plane.py payload_views, rlfleet/rpc/convert.py train_batch_from_proto), with sizes
counted by hand: what is staged is split into each group's columns (int32 ids, float32 log-probs:
rlfleet/dataplane/columns.py) and checked on arrival, kept under its replica's address and request id,
bounded in response tokens (beyond the bound a put is refused whole), and released by key."""
from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from rlfleet.dataplane.payload import SCHEMA, TokenPayload, to_table
from rlfleet.dataplane.plane import payload_refs, payload_views
from rlfleet.dataplane.staging import StagingFull, StagingStore, replica_of, staged_key
from rlfleet.dataplane.store import PayloadMissing
from rlfleet.errors import DataError, InvalidRequest
from rlfleet.rpc.convert import train_batch_from_proto, train_batch_to_proto
from rlfleet.types import PayloadRef, TrainBatch, TrainSample

pytestmark = pytest.mark.unit

A = "10.0.0.1:7001"  # two replicas' data-plane addresses
B = "10.0.0.2:7001"
# p0: 3 + 2 = 5 response tokens; p1: 1 token
GROUPS = {"p0-s0": [TokenPayload([5, 6, 7], [-0.5, -0.25, -1.0], 2), TokenPayload([8, 9], [-2.0, -0.125], 2)],
          "p1-s1": [TokenPayload([4], [-3.0], 2, 3)]}


def test_a_put_is_converted_keyed_by_replica_and_counted():
    store = StagingStore(max_tokens=100)
    assert store.put_table(to_table(GROUPS), A) == 2
    assert sorted(store.held()) == [staged_key(A, "p0-s0"), staged_key(A, "p1-s1")]
    assert store.tokens == 6  # 5 + 1
    got = store.staged([staged_key(A, "p0-s0"), staged_key(B, "p0-s0")])  # B never pushed p0-s0
    assert list(got) == [staged_key(A, "p0-s0")]
    group = got[staged_key(A, "p0-s0")]
    assert group.columns.payloads() == GROUPS["p0-s0"] and group.tokens == 5
    assert group.columns.token_ids.dtype == np.int32  # columns, not Python lists: ~9 bytes a token
    assert group.max_id == 9  # the group's largest id (checked against the vocabulary at Train)
    assert store.staged([staged_key(A, "p1-s1")])[staged_key(A, "p1-s1")].max_id == 4
    assert store.get([staged_key(A, "p1-s1")]) == {staged_key(A, "p1-s1"): GROUPS["p1-s1"]}
    assert replica_of(staged_key(A, "p0-s0")) == (A, "p0-s0")
    # the same request id from another replica (a re-dispatched prompt) is another group
    store.put_table(to_table({"p1-s1": [TokenPayload([3, 3], [-1.0, -1.0], 2)]}), B)
    assert store.tokens == 8 and len(store.held()) == 3
    # the same group pushed again replaces itself: counted once
    store.put_table(to_table({"p1-s1": GROUPS["p1-s1"]}), A)
    assert store.tokens == 8


def test_beyond_its_bound_a_put_is_refused_whole():
    store = StagingStore(max_tokens=7)
    store.put_table(to_table(GROUPS), A)  # 6 of 7
    two = {"p2-s2": [TokenPayload([1], [-1.0], 2)], "p3-s3": [TokenPayload([2], [-1.0], 2)]}  # 2 tokens
    with pytest.raises(StagingFull, match=r"staging 2 tokens \(2 group\(s\)\) would pass the learner's "
                                          r"learner.staging_max_tokens=7 \(6 held\)"):
        store.put_table(to_table(two), A)
    assert store.tokens == 6 and len(store.held()) == 2  # nothing of it kept
    assert store.release([staged_key(A, "p1-s1"), staged_key(A, "never")]) == 1
    assert store.tokens == 5
    assert store.put_table(to_table(two), A) == 2  # 5 + 2 fits now
    assert store.tokens == 7


def _raw(ids: list[list[int]], logprobs: list[list[float]]) -> pa.Table:
    n = len(ids)
    return pa.table([pa.array(["g"] * n), pa.array(range(n), pa.int32()), pa.array(ids, pa.list_(pa.int32())),
                     pa.array(logprobs, pa.list_(pa.float32())), pa.array([None] * n, pa.list_(pa.int8())),
                     pa.array([1] * n, pa.int64()), pa.array([-1] * n, pa.int64())], schema=SCHEMA)


@pytest.mark.parametrize("ids, logprobs, message", [
    ([[1, 2]], [[-1.0]], "token ids and log-probs differ in number"),
    ([[1, 2]], [[-1.0, math.nan]], "log-probs that are not finite"),
    ([[1], [2]], [[-1.0], [-math.inf]], "log-probs that are not finite"),
    ([[1, -2]], [[-1.0, -1.0]], "negative token ids"),
])
def test_bad_payloads_are_refused_on_arrival(ids, logprobs, message):
    store = StagingStore(max_tokens=100)
    with pytest.raises(DataError, match=message):
        store.put_table(_raw(ids, logprobs), A)
    assert store.held() == [] and store.tokens == 0


def _sample(address: str, rid: str, i: int, advantage: float) -> TrainSample:
    return TrainSample([1, 2], [], [], advantage, 2, payload=PayloadRef(address, rid, i))


def _columns(staged: dict) -> dict:
    return {key: group.columns for key, group in staged.items()}


def _filled(batch: TrainBatch, groups: dict, vocab_size: int | None) -> TrainBatch:
    """`batch` through the wire and the learner's conversion, the staged samples made with their views."""
    request = train_batch_to_proto(batch)
    return train_batch_from_proto(request, payload_views(payload_refs(request), groups, vocab_size))


def test_staged_samples_are_made_with_their_columns_and_the_rest_as_they_came():
    store = StagingStore(max_tokens=100)
    store.put_table(to_table(GROUPS), A)
    inline = TrainSample([1, 2], [11], [-0.5], 1.0, 2)  # a sample that came with its tokens
    samples = [_sample(A, "p0-s0", 1, -1.0), inline, _sample(A, "p1-s1", 0, 2.0)]
    batch = TrainBatch(3, samples, 1.0, 2)
    staged = store.staged([staged_key(A, "p0-s0"), staged_key(A, "p1-s1")])
    filled = _filled(batch, _columns(staged), vocab_size=10)
    assert [(list(s.prompt_ids), list(s.response_ids), list(s.behaviour_logprobs), s.advantage, s.payload)
            for s in filled.samples] == [([1, 2], [8, 9], [-2.0, -0.125], -1.0, None),
                                         ([1, 2], [11], [-0.5], 1.0, None), ([1, 2], [4], [-3.0], 2.0, None)]
    first = filled.samples[0]  # the group's columns, no list made: what the learner builds tensors from
    assert (first.response_ids.dtype, first.behaviour_logprobs.dtype) == (np.int32, np.float32)
    assert filled.samples[1] == inline  # Python lists, as it came
    assert (filled.step, filled.expected_version) == (3, 2)
    assert payload_views(payload_refs(train_batch_to_proto(batch)), {}, 10) is None
    unresolved = train_batch_from_proto(train_batch_to_proto(batch), None)  # the learner's data plane off
    assert unresolved.samples[0].payload == PayloadRef(A, "p0-s0", 1)


def test_payload_views_name_ids_outside_the_vocabulary_and_a_missing_sample():
    store = StagingStore(max_tokens=100)
    store.put_table(to_table(GROUPS), A)
    staged = _columns(store.staged([staged_key(A, "p0-s0")]))
    outside = r"sample 0: response_ids \(data plane\) has token ids outside \[0, 9\)"
    with pytest.raises(InvalidRequest, match=outside):
        _filled(TrainBatch(1, [_sample(A, "p0-s0", 0, 1.0)], 1.0, 0), staged, vocab_size=9)  # id 9
    missing = f"group p0-s0 from {A} has 2 samples, sample 2 was asked"
    with pytest.raises(PayloadMissing, match=missing):
        _filled(TrainBatch(1, [_sample(A, "p0-s0", 2, 1.0)], 1.0, 0), staged, vocab_size=None)


def test_groups_no_step_can_train_any_more_are_forgotten():
    # max_staleness 1, so max_age 2 (serve.py: max_staleness + 1, and one more of margin)
    store = StagingStore(max_tokens=100, max_age=2)
    store.put_table(to_table({"early": [TokenPayload([1], [-1.0], 0)]}), A)  # before the learner loaded
    assert store.advance(4) == 0  # a learner restored at version 4: "early" arrived at 4
    store.put_table(to_table({"at4": [TokenPayload([1, 2], [-1.0, -1.0], 4)]}), A)
    assert store.advance(5) == 0 and store.advance(6) == 0  # 4 >= 6 - 2: still trainable
    store.put_table(to_table({"at6": [TokenPayload([3], [-1.0], 6)]}), A)
    assert store.advance(7) == 2  # arrived at 4 < 7 - 2: "early" and "at4" go
    assert store.held() == [staged_key(A, "at6")] and store.tokens == 1
    unbounded = StagingStore(max_tokens=100)
    unbounded.put_table(to_table({"g": [TokenPayload([1], [-1.0], 0)]}), A)
    assert unbounded.advance(1_000) == 0 and unbounded.tokens == 1
