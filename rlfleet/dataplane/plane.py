"""The two ends of the data plane around the services (issue 44).

`hold` (a rollout replica): keeps a generated group's token ids and log-probs in the replica's store
and returns the group without them, saying where they are, for the Generate stream to the controller.
`fetch_into` (the learner): fills a Train request's samples that name a payload with the ids and
log-probs fetched from the replicas, one fetch per replica, in parallel.
"""
from __future__ import annotations

from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from rlfleet.errors import RlfleetError
from rlfleet.proto.v1 import learner_pb2
from rlfleet.types import GroupResult, PayloadRef
from rlfleet.dataplane.flight import PayloadClient
from rlfleet.dataplane.payload import TokenPayload
from rlfleet.dataplane.store import PayloadMissing, PayloadStore

FETCH_THREADS = 16


def hold(group: GroupResult, store: PayloadStore, address: str) -> GroupResult:
    """Puts `group`'s payloads in `store` (served at `address`); the group as the controller gets it."""
    store.put(group.request_id, [TokenPayload.of(c) for c in group.completions])
    return replace(group, payload_address=address,
                   completions=[replace(c, token_ids=[], logprobs=[],
                                        payload=PayloadRef(address, group.request_id, i, len(c.token_ids)))
                                for i, c in enumerate(group.completions)])


def fetch_into(request: learner_pb2.TrainRequest, client: PayloadClient) -> list[tuple[str, list[str]]]:
    """Fills the samples of `request` that name a payload; returns (address, request ids) fetched.
    PayloadMissing names what could not be fetched (released, or its replica gone)."""
    wanted: dict[str, set[str]] = defaultdict(set)
    for s in request.samples:
        if s.HasField("payload"):
            wanted[s.payload.address].add(s.payload.request_id)
    if not wanted:
        return []
    fetched = [(address, sorted(ids)) for address, ids in wanted.items()]

    def fetch(item: tuple[str, list[str]]) -> dict[str, list[TokenPayload]]:
        address, ids = item
        try:
            return client.fetch(address, ids)
        except PayloadMissing:
            raise
        except RlfleetError as exc:  # the replica is gone: its groups are, for this step
            raise PayloadMissing(f"{len(ids)} group(s) at {address} could not be fetched: {exc}") from exc

    with ThreadPoolExecutor(max_workers=min(FETCH_THREADS, len(fetched))) as pool:
        groups = {rid: payloads for got in pool.map(fetch, fetched) for rid, payloads in got.items()}
    for s in request.samples:
        if s.HasField("payload"):
            payloads = groups[s.payload.request_id]
            if s.payload.sample >= len(payloads):
                raise PayloadMissing(f"group {s.payload.request_id} at {s.payload.address} has "
                                     f"{len(payloads)} samples, sample {s.payload.sample} was asked")
            p = payloads[s.payload.sample]
            s.response_ids.extend(p.token_ids)
            s.behaviour_logprobs.extend(p.logprobs)
            s.ClearField("payload")
    return fetched
