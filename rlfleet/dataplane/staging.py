"""The learner's staging store (issue 44): the replicas push each group's payload here as soon as it
is generated, so the learner holds the next batch before the Train call and a replica killed after
that loses nothing. A pushed table is split on arrival into each group's compact columns (columns.py:
int32 ids, float32 log-probs, ~9 bytes a token; Python lists took ~74) and checked (lengths, ids >= 0,
finite log-probs), off the Train call; each group's largest id is kept for the vocabulary check at
Train, where the learner takes the columns as they are (plane.fill_payloads). Bounded: a put beyond
`max_tokens` response tokens is refused (StagingFull), and those groups are fetched from their
replicas at Train time as unstaged ones are.
Groups no Train can take any more leave on their own (`advance`): pushed but never heard of by the
controller (a stream cut after the group left the replica) or of a controller that restarted.

A staged group is keyed by its replica's data-plane address and its request id (`staged_key`), as the
Train request's PayloadRef names it: a prompt re-dispatched after a stream broke keeps its request id,
and only the replica the controller heard from holds the group it scored.
"""
from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, replace

import pyarrow as pa

from rlfleet.errors import RlfleetError
from rlfleet.dataplane.columns import GroupColumns, columns_of, no_samples
from rlfleet.dataplane.payload import TokenPayload, to_table
from rlfleet.dataplane.store import PayloadMissing, PayloadStore


def staged_key(address: str, request_id: str) -> str:
    """The staging store's key of a group: its request id at its replica's data-plane address."""
    return f"{request_id}@{address}"


def replica_of(key: str) -> tuple[str, str]:
    """(replica address, request id) of a staged_key."""
    request_id, _, address = key.rpartition("@")
    return address, request_id


class StagingFull(RlfleetError, MemoryError):
    """A put would take the staging store past its bound: the groups stay at their replicas."""

    grpc_code = "RESOURCE_EXHAUSTED"


@dataclass(frozen=True)
class StagedGroup:
    columns: GroupColumns
    arrived: int | None = None  # the learner's policy version when it arrived (None: before it had one)

    @property
    def tokens(self) -> int:
        return self.columns.tokens

    @property
    def max_id(self) -> int:  # the group's largest token id (checked against the vocabulary at Train)
        return self.columns.max_id


class StagingStore(PayloadStore):
    """Staged groups by request id, at most `max_tokens` response tokens; safe from several threads.

    `max_age`: policy versions a group stays (None: until released). A group generated at version v
    arrives at a learner version a >= v and is trained at a version s <= v + max_staleness, so
    max_staleness + 1 versions after its arrival no Train can take it: `advance` forgets it then."""

    def __init__(self, max_tokens: int, max_age: int | None = None) -> None:
        self.max_tokens, self.max_age = max_tokens, max_age
        self._groups: dict[str, StagedGroup] = {}
        self._tokens = 0
        self._version: int | None = None  # the learner's, once loaded
        self._lock = threading.Lock()

    def advance(self, version: int) -> int:
        """The learner holds `version` now; forgets the groups older than max_age versions (how many)."""
        with self._lock:
            if self._version is None:  # what came before the learner was loaded arrived now
                self._groups = {key: replace(g, arrived=version) for key, g in self._groups.items()}
            self._version = version
            if self.max_age is None:
                return 0
            old = [key for key, g in self._groups.items() if g.arrived < version - self.max_age]
            for key in old:
                self._tokens -= self._groups.pop(key).tokens
            return len(old)

    @property
    def tokens(self) -> int:
        return self._tokens

    def put_table(self, table: pa.Table, replica: str) -> int:
        """Stages the groups of a payload table (payload.SCHEMA) pushed by the replica whose data plane
        is at `replica`; returns how many. DataError: a table that is not one or holds bad values;
        StagingFull: it does not fit (nothing of it is kept)."""
        groups = {staged_key(replica, rid): columns for rid, columns in columns_of(table).items()}
        with self._lock:
            new = sum(c.tokens for key, c in groups.items() if key not in self._groups)
            if self._tokens + new > self.max_tokens:
                raise StagingFull(f"staging {new} tokens ({len(groups)} group(s)) would pass the learner's "
                                  f"learner.staging_max_tokens={self.max_tokens} ({self._tokens} held)")
            for key, columns in groups.items():
                self._put(key, StagedGroup(columns, self._version))
        return len(groups)

    def _put(self, rid: str, group: StagedGroup) -> None:
        old = self._groups.get(rid)
        self._tokens += group.tokens - (old.tokens if old is not None else 0)
        self._groups[rid] = group

    def put(self, request_id: str, payloads: list[TokenPayload]) -> None:
        """Stages one group under its key (staged_key) as given, checked as a put_table's are."""
        columns = columns_of(to_table({request_id: payloads})).get(request_id) or no_samples()
        with self._lock:
            self._put(request_id, StagedGroup(columns, self._version))

    def staged(self, request_ids: Iterable[str]) -> dict[str, StagedGroup]:
        """Those of `request_ids` (staged_key's) staged here; the others are not named."""
        with self._lock:
            return {rid: self._groups[rid] for rid in dict.fromkeys(request_ids) if rid in self._groups}

    def get(self, request_ids: Iterable[str]) -> dict[str, list[TokenPayload]]:
        ids = list(request_ids)
        found = self.staged(ids)
        missing = [rid for rid in ids if rid not in found]
        if missing:
            raise PayloadMissing(f"{len(missing)} group(s) not staged here: {missing[:5]}")
        return {rid: found[rid].columns.payloads() for rid in ids}

    def release(self, request_ids: Iterable[str]) -> int:
        with self._lock:
            gone = [self._groups.pop(rid) for rid in request_ids if rid in self._groups]
            self._tokens -= sum(g.tokens for g in gone)
            return len(gone)

    def held(self) -> list[str]:
        with self._lock:
            return list(self._groups)
