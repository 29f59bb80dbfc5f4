"""controller/payload_release.py: a group the controller drops on data_plane=flight leaves the store of
the replica holding it (a real Flight server), the other groups stay; a replica gone is no error."""
from __future__ import annotations

import pytest

from rlfleet.data.prompts import Prompt
from rlfleet.dataplane.flight import PayloadClient, PayloadServer
from rlfleet.dataplane.payload import TokenPayload, to_table
from rlfleet.dataplane.staging import StagingStore, staged_key
from rlfleet.dataplane.store import MemoryStore
from rlfleet.types import Completion, PayloadRef, ScoreResult
from controller.groups import ScoredGroup
from controller.payload_release import PayloadReleaser

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]


def _group(seq: int, address: str) -> ScoredGroup:
    rid = f"p{seq}-s{seq}"
    completions = [Completion([], [], "stop", 0, payload=PayloadRef(address, rid, i, 1)) for i in range(2)]
    return ScoredGroup(seq, Prompt(seq, "q", [1], "t", "1"), completions, [ScoreResult("a", 1.0)] * 2)


def test_a_dropped_group_leaves_its_replica_and_a_gone_replica_is_no_error():
    store = MemoryStore()
    for rid in ("p0-s0", "p1-s1"):
        store.put(rid, [TokenPayload([5], [-1.0], 0)] * 2)
    server = PayloadServer(store)
    gone = PayloadServer(MemoryStore())
    gone_address = gone.address
    gone.shutdown()
    releaser = PayloadReleaser(PayloadClient(timeout_s=5))
    releaser.release(_group(0, server.address))
    releaser.release(_group(7, gone_address))  # logged, not raised
    releaser.close(wait=True)
    assert store.held() == ["p1-s1"]
    server.shutdown()


def test_a_dropped_group_also_leaves_the_learners_staging_store():
    """Pushed to the learner before it was dropped (issue 44): released there too, under its replica's
    address (the same request id staged from another replica stays)."""
    replica, other = MemoryStore(), "10.9.9.9:1"
    replica.put("p0-s0", [TokenPayload([5], [-1.0], 0)] * 2)
    server = PayloadServer(replica)
    staging = StagingStore(max_tokens=100)
    staging.put_table(to_table({"p0-s0": [TokenPayload([5], [-1.0], 0)] * 2}), server.address)
    staging.put_table(to_table({"p0-s0": [TokenPayload([6], [-1.0], 0)] * 2}), other)
    sink = PayloadServer(staging)
    releaser = PayloadReleaser(PayloadClient(timeout_s=5), sink=lambda: sink.address)
    releaser.release(_group(0, server.address))
    releaser.close(wait=True)
    assert replica.held() == []
    assert staging.held() == [staged_key(other, "p0-s0")] and staging.tokens == 2
    server.shutdown()
    sink.shutdown()
