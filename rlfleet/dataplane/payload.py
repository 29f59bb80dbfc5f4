"""A group's token payload and its Arrow form (pure: no transport).

One row per sample: the request id, the sample's index in its group, its token ids (int32), their
sampling log-probs (float32, as the gRPC path's packed `repeated float`, so both planes hand the
learner the same bits), its loss mask (int8, null when every token counts) and its versions.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import pyarrow as pa

from rlfleet.errors import DataError
from rlfleet.types import Completion

SCHEMA = pa.schema([
    ("request_id", pa.string()),
    ("sample", pa.int32()),
    ("token_ids", pa.list_(pa.int32())),
    ("logprobs", pa.list_(pa.float32())),
    ("loss_mask", pa.list_(pa.int8())),
    ("policy_version", pa.int64()),
    ("last_policy_version", pa.int64()),
])


@dataclass(frozen=True)
class TokenPayload:
    """What the learner needs of one sample beyond what the controller holds."""

    token_ids: list[int]
    logprobs: list[float]
    policy_version: int
    last_policy_version: int = -1
    loss_mask: list[int] | None = None

    @classmethod
    def of(cls, completion: Completion) -> TokenPayload:
        return cls(list(completion.token_ids), list(completion.logprobs), completion.policy_version,
                   completion.last_policy_version,
                   None if completion.loss_mask is None else list(completion.loss_mask))


def to_table(groups: Mapping[str, list[TokenPayload]]) -> pa.Table:
    """The groups' payloads, one row per sample, in the order given."""
    rows = [(rid, i, p) for rid, payloads in groups.items() for i, p in enumerate(payloads)]
    for rid, i, p in rows:
        if len(p.token_ids) != len(p.logprobs):
            raise DataError(f"payload of {rid} sample {i}: {len(p.token_ids)} token ids but "
                            f"{len(p.logprobs)} log-probs")
    return pa.table([
        pa.array([rid for rid, _, _ in rows], pa.string()),
        pa.array([i for _, i, _ in rows], pa.int32()),
        pa.array([p.token_ids for _, _, p in rows], pa.list_(pa.int32())),
        pa.array([p.logprobs for _, _, p in rows], pa.list_(pa.float32())),
        pa.array([p.loss_mask for _, _, p in rows], pa.list_(pa.int8())),
        pa.array([p.policy_version for _, _, p in rows], pa.int64()),
        pa.array([p.last_policy_version for _, _, p in rows], pa.int64()),
    ], schema=SCHEMA)


def from_table(table: pa.Table | Iterable[pa.RecordBatch]) -> dict[str, list[TokenPayload]]:
    """The groups in `table`, by request id, samples in their index order."""
    if not isinstance(table, pa.Table):
        table = pa.Table.from_batches(list(table), schema=SCHEMA)
    if not table.schema.equals(SCHEMA):
        raise DataError(f"not a token-payload table: schema {table.schema}")
    cols = {name: table.column(name).to_pylist() for name in SCHEMA.names}
    groups: dict[str, dict[int, TokenPayload]] = {}
    for rid, i, ids, lps, mask, v, last in zip(*(cols[n] for n in SCHEMA.names)):
        groups.setdefault(rid, {})[i] = TokenPayload(ids, lps, v, last, mask)
    return {rid: [samples[i] for i in sorted(samples)] for rid, samples in groups.items()}
