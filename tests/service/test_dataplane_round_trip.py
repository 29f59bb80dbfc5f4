"""The data plane end to end in process (rlfleet/dataplane/plane.py, rlfleet/rpc/convert.py): a group a
replica holds travels to the controller without its ids and log-probs, the controller's Train request
names where they are, and the learner's fetch (each group's columns, rlfleet/dataplane/columns.py)
fills its batch to exactly the tokens and float32 log-probs of the batch the inline path builds;
a replica gone, or a group released, is named (not retried as an unreachable learner)."""
from __future__ import annotations

import numpy as np
import pytest

from rlfleet.dataplane.flight import PayloadClient, PayloadServer
from rlfleet.dataplane.plane import fetch_columns, hold, payload_refs, payload_views
from rlfleet.dataplane.store import MemoryStore, PayloadMissing
from rlfleet.errors import InvalidRequest
from rlfleet.proto.v1 import learner_pb2
from rlfleet.rpc.convert import group_from_proto, group_to_proto, train_batch_from_proto, train_batch_to_proto
from rlfleet.types import Completion, GroupResult, TrainBatch, TrainSample

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]


def _group(rid: str, seed: int) -> GroupResult:
    return GroupResult(rid, [Completion([seed + i, 7, 151_000 + i], [-0.1 * (i + 1), -2.0, -1e-3], "stop", 4,
                                        text=f"answer {i}", last_policy_version=5) for i in range(3)])


def _batch(groups: list[GroupResult]) -> learner_pb2.TrainRequest:
    """What the controller sends: one sample per completion (controller/groups.py's fields)."""
    samples = [TrainSample([1, 2], c.token_ids, c.logprobs, 0.5 * i, c.policy_version, payload=c.payload)
               for g in groups for i, c in enumerate(g.completions)]
    return train_batch_to_proto(TrainBatch(3, samples, 1.0, 4))


def _learned(batch: TrainBatch) -> list[tuple]:
    """What the learner trains on of each sample: ids, the log-probs' float32 bits, the rest."""
    return [([int(i) for i in s.prompt_ids], [int(i) for i in s.response_ids],
             np.asarray(s.behaviour_logprobs, np.float32).tobytes(), s.advantage, s.generation_version,
             s.payload) for s in batch.samples]


def test_held_groups_reach_the_learner_as_the_inline_request():
    stores = [MemoryStore(), MemoryStore()]
    servers = [PayloadServer(s) for s in stores]
    try:
        made = [_group("p0-s0", 10), _group("p1-s1", 20), _group("p2-s2", 30)]
        # the replicas: groups 0 and 2 on the first, 1 on the second; the stream carries no tokens
        owner = [0, 1, 0]
        streamed = [group_to_proto(hold(g, stores[o], servers[o].address)) for g, o in zip(made, owner)]
        assert all(not c.token_ids and not c.logprobs and c.response_length == 3
                   for m in streamed for c in m.completions)
        received = [group_from_proto(m) for m in streamed]  # the controller's view
        assert [c.response_tokens for g in received for c in g.completions] == [3] * 9
        assert received[1].completions[2].payload.address == servers[1].address
        request = _batch(received)
        refs = payload_refs(request)
        fetched, groups = fetch_columns(refs, PayloadClient(timeout_s=10))
        assert sorted(fetched) == sorted([(servers[0].address, ["p0-s0", "p2-s2"]),
                                          (servers[1].address, ["p1-s1"])])
        batch = train_batch_from_proto(request, payload_views(refs, groups, vocab_size=151_936))
        inline = train_batch_from_proto(_batch(made))  # float32 log-probs as Python floats
        assert _learned(batch) == _learned(inline)
        assert batch.samples[0].response_ids.dtype == np.int32  # columns: no Python list per token
    finally:
        for s in servers:
            s.shutdown()


def test_a_group_released_or_a_replica_gone_is_named():
    store = MemoryStore()
    server = PayloadServer(store)
    received = [group_from_proto(group_to_proto(hold(_group("p0-s0", 1), store, server.address)))]
    store.release(["p0-s0"])
    with pytest.raises(PayloadMissing, match=r"not held here: \['p0-s0'\]"):
        fetch_columns(payload_refs(_batch(received)), PayloadClient(timeout_s=10))
    server.shutdown()
    with pytest.raises(PayloadMissing, match=f"1 group\\(s\\) at {server.address} could not be fetched"):
        fetch_columns(payload_refs(_batch(received)), PayloadClient(timeout_s=5))


def test_a_replica_that_serves_bad_values_is_refused_as_a_staged_put_is():
    store = MemoryStore()
    server = PayloadServer(store)
    try:
        group = GroupResult("p0-s0", [Completion([3, 4], [-1.0, float("nan")], "stop", 4)])
        received = [group_from_proto(group_to_proto(hold(group, store, server.address)))]
        with pytest.raises(InvalidRequest, match=f"the data plane at {server.address} served bad payloads: "
                                                 "a payload has log-probs that are not finite"):
            fetch_columns(payload_refs(_batch(received)), PayloadClient(timeout_s=10))
    finally:
        server.shutdown()
