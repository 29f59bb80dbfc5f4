"""The two ends of the data plane around the services (issue 44).

`hold` (a rollout replica): keeps a generated group's token ids and log-probs in the replica's store
and returns the group without them, saying where they are, for the Generate stream to the controller.
`fetch_into` (the learner): fills a Train request's samples that name a payload with the ids and
log-probs fetched from the replicas, one fetch per replica, in parallel, leaving out the groups the
learner's staging store holds (staging.py), which `fill_staged` puts in the converted batch.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Container
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from rlfleet.errors import InvalidRequest, RlfleetError
from rlfleet.proto.v1 import learner_pb2
from rlfleet.types import GroupResult, PayloadRef, TrainBatch
from rlfleet.dataplane.flight import PayloadClient
from rlfleet.dataplane.payload import TokenPayload
from rlfleet.dataplane.staging import StagedGroup, staged_key
from rlfleet.dataplane.store import PayloadMissing, PayloadStore

FETCH_THREADS = 16


def hold(group: GroupResult, store: PayloadStore, address: str) -> GroupResult:
    """Puts `group`'s payloads in `store` (served at `address`); the group as the controller gets it."""
    store.put(group.request_id, [TokenPayload.of(c) for c in group.completions])
    return replace(group, payload_address=address,
                   completions=[replace(c, token_ids=[], logprobs=[],
                                        payload=PayloadRef(address, group.request_id, i, len(c.token_ids)))
                                for i, c in enumerate(group.completions)])


def payload_keys(request: learner_pb2.TrainRequest) -> list[str]:
    """The staging keys (staging.staged_key) of the groups `request`'s samples name."""
    return list(dict.fromkeys(staged_key(s.payload.address, s.payload.request_id)
                              for s in request.samples if s.HasField("payload")))


def fetch_into(request: learner_pb2.TrainRequest, client: PayloadClient,
               staged: Container[str] = ()) -> list[tuple[str, list[str]]]:
    """Fills the samples of `request` that name a payload not in `staged` (staging keys); returns
    (address, request ids) fetched. PayloadMissing names what could not be fetched (released, or its
    replica gone)."""
    wanted: dict[str, set[str]] = defaultdict(set)
    for s in request.samples:
        if s.HasField("payload") and staged_key(s.payload.address, s.payload.request_id) not in staged:
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
        if s.HasField("payload") and staged_key(s.payload.address, s.payload.request_id) not in staged:
            payloads = groups[s.payload.request_id]
            if s.payload.sample >= len(payloads):
                raise PayloadMissing(f"group {s.payload.request_id} at {s.payload.address} has "
                                     f"{len(payloads)} samples, sample {s.payload.sample} was asked")
            p = payloads[s.payload.sample]
            s.response_ids.extend(p.token_ids)
            s.behaviour_logprobs.extend(p.logprobs)
            s.ClearField("payload")
    return fetched


def fill_staged(batch: TrainBatch, staged: dict[str, StagedGroup], vocab_size: int | None) -> TrainBatch:
    """`batch` (converted from a request fetch_into filled) with the samples whose group is staged given
    their ids and log-probs from the staging store: lists converted and checked on arrival, so nothing
    is fetched or converted here; the ids' range is checked against the learner's vocabulary."""
    if not staged:
        return batch
    samples = []
    for i, s in enumerate(batch.samples):
        group = staged.get(staged_key(s.payload.address, s.payload.request_id)) if s.payload else None
        if group is None:
            samples.append(s)
            continue
        if vocab_size is not None and group.max_id >= vocab_size:
            raise InvalidRequest(f"sample {i}: response_ids (staged) has token ids outside [0, {vocab_size})")
        if s.payload.sample >= len(group.payloads):
            raise PayloadMissing(f"group {s.payload.request_id} staged from {s.payload.address} has "
                                 f"{len(group.payloads)} samples, sample {s.payload.sample} was asked")
        p = group.payloads[s.payload.sample]
        samples.append(replace(s, response_ids=p.token_ids, behaviour_logprobs=p.logprobs, payload=None))
    return replace(batch, samples=samples)
