"""The two ends of the data plane around the services (issue 44).

`hold` (a rollout replica): keeps a generated group's token ids and log-probs in the replica's store
and returns the group without them, saying where they are, for the Generate stream to the controller.
`fetch_columns` (the learner): fetches the groups a Train request's samples name (`payload_refs`, read
once) from the replicas,
one fetch per replica, in parallel, as each group's columns (columns.py), leaving out those the
learner's staging store holds (staging.py); `payload_views` gives the Train request's samples their
ids and log-probs from either, as numpy views (no per-token Python), for the conversion to make each
sample with them.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Container, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from rlfleet.errors import DataError, InvalidRequest, RlfleetError
from rlfleet.proto.v1 import learner_pb2
from rlfleet.types import GroupResult, PayloadRef
from rlfleet.dataplane.columns import GroupColumns, columns_of
from rlfleet.dataplane.flight import PayloadClient
from rlfleet.dataplane.payload import TokenPayload
from rlfleet.dataplane.staging import replica_of, staged_key
from rlfleet.dataplane.store import PayloadMissing, PayloadStore

FETCH_THREADS = 16


def hold(group: GroupResult, store: PayloadStore, address: str) -> GroupResult:
    """Puts `group`'s payloads in `store` (served at `address`); the group as the controller gets it."""
    store.put(group.request_id, [TokenPayload.of(c) for c in group.completions])
    return replace(group, payload_address=address,
                   completions=[replace(c, token_ids=[], logprobs=[],
                                        payload=PayloadRef(address, group.request_id, i, len(c.token_ids)))
                                for i, c in enumerate(group.completions)])


@dataclass(frozen=True)
class PayloadRefs:
    """Where a Train request's samples' payloads are, read from it once (payload_refs): per sample, its
    group's staging key (staging.staged_key; None: it names no payload) and its index in the group."""

    keys: list[str | None]
    samples: list[int]

    def groups(self) -> list[str]:
        """The staging keys of the groups named, each once, in the order first named."""
        return [key for key in dict.fromkeys(self.keys) if key is not None]


def payload_refs(request: learner_pb2.TrainRequest) -> PayloadRefs:
    keys: list[str | None] = []
    samples: list[int] = []
    for s in request.samples:
        if s.HasField("payload"):
            ref = s.payload
            keys.append(staged_key(ref.address, ref.request_id))
            samples.append(ref.sample)
        else:
            keys.append(None)
            samples.append(-1)
    return PayloadRefs(keys, samples)


def fetch_columns(refs: PayloadRefs, client: PayloadClient, staged: Container[str] = ()
                  ) -> tuple[list[tuple[str, list[str]]], dict[str, GroupColumns]]:
    """The groups a Train request's samples name (`refs`) that are not in `staged` (staging keys), fetched
    from their replicas, one fetch per replica, in parallel: (address, request ids) fetched, and each
    group's columns by staging key, checked as a staged put is (columns.py). PayloadMissing names what
    could not be fetched (released, or its replica gone)."""
    wanted: dict[str, list[str]] = defaultdict(list)
    for key in refs.groups():
        if key not in staged:
            address, request_id = replica_of(key)
            wanted[address].append(request_id)
    if not wanted:
        return [], {}
    fetched = [(address, sorted(ids)) for address, ids in wanted.items()]

    def fetch(item: tuple[str, list[str]]) -> dict[str, GroupColumns]:
        address, ids = item
        try:
            table = client.fetch_table(address, ids)
        except PayloadMissing:
            raise
        except RlfleetError as exc:  # the replica is gone: its groups are, for this step
            raise PayloadMissing(f"{len(ids)} group(s) at {address} could not be fetched: {exc}") from exc
        try:
            got = columns_of(table)
        except DataError as exc:
            raise InvalidRequest(f"the data plane at {address} served bad payloads: {exc}") from exc
        absent = [rid for rid in ids if rid not in got]
        if absent:
            raise PayloadMissing(f"{len(absent)} group(s) at {address} were not served: {absent[:5]}")
        return {staged_key(address, rid): got[rid] for rid in ids}

    with ThreadPoolExecutor(max_workers=min(FETCH_THREADS, len(fetched))) as pool:
        groups = {key: columns for got in pool.map(fetch, fetched) for key, columns in got.items()}
    return fetched, groups


def payload_views(refs: PayloadRefs, groups: Mapping[str, GroupColumns],
                  vocab_size: int | None) -> tuple[list, list] | None:
    """Per sample of a Train request (`refs`), its response ids and behaviour log-probs as views of its
    group's columns (int32, float32) where it names a payload in `groups` (by staging key: staged, or
    fetched by fetch_columns), else None; None when `groups` is empty. convert.train_batch_from_proto
    makes each sample once with them (the learner builds its tensors from the views, no list is made).
    Their range is checked against the learner's vocabulary here, the rest of their checks were made as
    they arrived."""
    if not groups:
        return None
    response_ids: list = []
    logprobs: list = []
    for i, (key, j) in enumerate(zip(refs.keys, refs.samples)):
        group = groups.get(key) if key is not None else None
        if group is None:
            response_ids.append(None)
            logprobs.append(None)
            continue
        if vocab_size is not None and group.max_id >= vocab_size:
            raise InvalidRequest(f"sample {i}: response_ids (data plane) has token ids outside "
                                 f"[0, {vocab_size})")
        if j >= group.samples:
            address, request_id = replica_of(key)
            raise PayloadMissing(f"group {request_id} from {address} has "
                                 f"{group.samples} samples, sample {j} was asked")
        response_ids.append(group.response_ids(j))
        logprobs.append(group.behaviour_logprobs(j))
    return response_ids, logprobs
