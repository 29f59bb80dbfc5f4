"""A payload table (payload.SCHEMA) split into each group's compact columns: what the learner's staging
store holds and the fetched path hands on (issue 44). int32 ids, float32 log-probs and, only where a
sample has one, int8 loss masks: ~9 bytes a response token, against ~70 for Python lists of ints and
floats. Copied out of the table, so a group released frees its memory (a put's buffers are not kept
alive by the groups of it still staged). The learner takes each sample as numpy views of its group
(`response_ids(j)`, `behaviour_logprobs(j)`), the same values as from_table's lists (float32 bits).

Checked as split, with whole-column operations: no nulls, as many log-probs (and mask entries) as
token ids, ids >= 0, finite log-probs; each group's largest id is kept for the vocabulary check at
Train. Per-sample Python only to group the rows (a group's rows usually come in order, contiguous).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rlfleet.errors import DataError
from rlfleet.dataplane.payload import SCHEMA, TokenPayload


@dataclass(frozen=True, eq=False)
class GroupColumns:
    """One group's samples, concatenated in sample order: sample j is [offsets[j], offsets[j + 1])."""

    token_ids: np.ndarray  # int32
    logprobs: np.ndarray  # float32, one per token id
    offsets: np.ndarray  # int64, samples + 1
    loss_mask: np.ndarray | None  # int8, one per token id (1 for a sample without one); None: no sample has
    masked: np.ndarray | None  # bool per sample: whether it came with a mask (None: none did)
    policy_version: np.ndarray  # int64 per sample
    last_policy_version: np.ndarray  # int64 per sample
    max_id: int

    @property
    def samples(self) -> int:
        return len(self.offsets) - 1

    @property
    def tokens(self) -> int:
        return len(self.token_ids)

    def response_ids(self, j: int) -> np.ndarray:
        return self.token_ids[self.offsets[j]:self.offsets[j + 1]]

    def behaviour_logprobs(self, j: int) -> np.ndarray:
        return self.logprobs[self.offsets[j]:self.offsets[j + 1]]

    def payloads(self) -> list[TokenPayload]:
        """As Python lists (a fetch served from the staging store; tests): the values from_table gives."""
        ids, lps = self.token_ids.tolist(), self.logprobs.tolist()
        mask = self.loss_mask.tolist() if self.loss_mask is not None else None
        bounds = self.offsets.tolist()
        return [TokenPayload(ids[a:b], lps[a:b], int(self.policy_version[j]),
                             int(self.last_policy_version[j]),
                             mask[a:b] if mask is not None and self.masked[j] else None)
                for j, (a, b) in enumerate(zip(bounds, bounds[1:]))]


def no_samples() -> GroupColumns:
    """A group without samples (columns_of makes none: a table has no row of it)."""
    none = np.zeros(0, np.int64)
    return GroupColumns(np.zeros(0, np.int32), np.zeros(0, np.float32), np.zeros(1, np.int64), None, None,
                        none, none, 0)


def _numpy(array: pa.Array) -> np.ndarray:
    return array.to_numpy(zero_copy_only=False)


def _check(table: pa.Table) -> None:
    for name in ("token_ids", "logprobs"):
        if table.column(name).null_count:
            raise DataError(f"a payload has a sample without token ids or log-probs ({name} null)")
    for name in ("request_id", "sample", "policy_version", "last_policy_version"):
        if table.column(name).null_count:
            raise DataError(f"a payload has a sample whose {name} is null")
    ids, logprobs, mask = (table.column(n) for n in ("token_ids", "logprobs", "loss_mask"))
    lengths = pc.list_value_length(ids)
    if pc.any(pc.not_equal(lengths, pc.list_value_length(logprobs))).as_py():
        raise DataError("a payload has a sample whose token ids and log-probs differ in number")
    masked = pc.is_valid(mask)
    if pc.any(pc.and_(masked, pc.not_equal(lengths, pc.list_value_length(mask)))).as_py():
        raise DataError("a payload has a sample whose loss mask and token ids differ in number")


def columns_of(table: pa.Table) -> dict[str, GroupColumns]:
    """The groups of `table`, by request id in the order they first appear, samples in index order (a
    sample index given twice: the last row). DataError: not a payload table, or bad values."""
    if not table.schema.equals(SCHEMA):
        raise DataError(f"not a token-payload table: schema {table.schema}")
    if table.num_rows == 0:
        return {}
    table = table.combine_chunks()
    _check(table)
    arrow_ids, arrow_lps = (pc.list_flatten(table.column(n)) for n in ("token_ids", "logprobs"))
    if arrow_ids.null_count or arrow_lps.null_count:
        raise DataError("a payload has null token ids or log-probs")
    flat_ids, flat_lps = _numpy(arrow_ids), _numpy(arrow_lps)
    if len(flat_lps) and not np.isfinite(flat_lps).all():
        raise DataError("a payload has log-probs that are not finite")
    if len(flat_ids) and flat_ids.min() < 0:
        raise DataError("a payload has negative token ids")
    lengths = _numpy(pc.list_value_length(table.column("token_ids"))).astype(np.int64)
    starts = np.concatenate(([0], np.cumsum(lengths)))
    masked = _numpy(pc.is_valid(table.column("loss_mask")))
    flat_mask = _numpy(pc.list_flatten(table.column("loss_mask"))) if masked.any() else None
    # the flattened masks skip the rows without one: their own starts
    mask_starts = np.concatenate(([0], np.cumsum(np.where(masked, lengths, 0))))
    versions = _numpy(table.column("policy_version"))
    lasts = _numpy(table.column("last_policy_version"))

    rows_of: dict[str, dict[int, int]] = {}
    for row, (rid, sample) in enumerate(zip(table.column("request_id").to_pylist(),
                                            table.column("sample").to_pylist())):
        rows_of.setdefault(rid, {})[sample] = row
    groups = {}
    for rid, by_sample in rows_of.items():
        rows = np.array([by_sample[i] for i in sorted(by_sample)], dtype=np.int64)
        group_masked = masked[rows]
        if (rows == np.arange(rows[0], rows[0] + len(rows))).all():  # in order, contiguous: one slice
            ids = flat_ids[starts[rows[0]]:starts[rows[-1] + 1]].copy()
            lps = flat_lps[starts[rows[0]]:starts[rows[-1] + 1]].copy()
        else:
            ids = np.concatenate([flat_ids[starts[r]:starts[r + 1]] for r in rows])
            lps = np.concatenate([flat_lps[starts[r]:starts[r + 1]] for r in rows])
        mask = None
        if group_masked.any():
            mask = np.concatenate([flat_mask[mask_starts[r]:mask_starts[r + 1]] if masked[r]
                                   else np.ones(lengths[r], np.int8) for r in rows])
        groups[rid] = GroupColumns(
            ids, lps, np.concatenate(([0], np.cumsum(lengths[rows]))), mask,
            group_masked if mask is not None else None, versions[rows], lasts[rows],
            int(ids.max()) if len(ids) else 0)
    return groups
