"""A payload table as each group's compact columns (rlfleet/dataplane/columns.py): what the learner's
staging store holds and the fetched path hands on, ~9 bytes a token instead of Python lists; checked
as it is split (lengths, nulls, ids >= 0, finite log-probs), samples in their index order, the same
values (float32 bits) as the lists from_table makes."""
from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from rlfleet.dataplane.columns import columns_of
from rlfleet.dataplane.payload import SCHEMA, TokenPayload, from_table, to_table
from rlfleet.errors import DataError

pytestmark = pytest.mark.unit

GROUPS = {
    "p3-s7": [TokenPayload([5, 6, 7], [-0.1, -2.5, -0.3], 4, 5),
              TokenPayload([9, 151_000], [-1.0, -1e-3], 4, -1, loss_mask=[1, 0]),
              TokenPayload([], [], 4)],
    "p0-s1": [TokenPayload([2], [-7.0], 3)],
}


def test_each_group_becomes_typed_columns_with_the_lists_values():
    table = to_table(GROUPS)
    got = columns_of(table)
    assert list(got) == ["p3-s7", "p0-s1"]
    g = got["p3-s7"]
    assert (g.token_ids.dtype, g.logprobs.dtype, g.loss_mask.dtype) == (np.int32, np.float32, np.int8)
    assert g.offsets.tolist() == [0, 3, 5, 5] and (g.samples, g.tokens, g.max_id) == (3, 5, 151_000)
    assert g.response_ids(1).tolist() == [9, 151_000]
    assert g.behaviour_logprobs(0).tobytes() == np.array([-0.1, -2.5, -0.3], np.float32).tobytes()
    assert got["p0-s1"].loss_mask is None and got["p0-s1"].max_id == 2  # no sample of it has a mask
    # the same payloads as the lists the table gives (float32 log-probs as Python floats)
    assert {rid: c.payloads() for rid, c in got.items()} == from_table(table)


def test_samples_come_in_their_index_order_whatever_the_rows_order():
    table = to_table(GROUPS)
    shuffled = table.take([3, 2, 0, 1])  # p0-s1, then p3-s7's samples 2, 0, 1
    got = columns_of(shuffled)
    assert got["p3-s7"].payloads() == from_table(table)["p3-s7"]
    assert got["p3-s7"].token_ids.tolist() == [5, 6, 7, 9, 151_000]


def test_a_token_costs_nine_bytes_and_nothing_of_the_table_is_kept():
    rng = np.random.default_rng(0)
    groups = {f"g{g}": [TokenPayload(rng.integers(0, 150_000, 300).tolist(), [-0.5] * 300, 1,
                                     loss_mask=[1] * 300 if s == 0 else None) for s in range(16)]
              for g in range(4)}
    before = pa.total_allocated_bytes()
    table = to_table(groups)
    assert pa.total_allocated_bytes() > before
    got = columns_of(table)
    del table
    assert pa.total_allocated_bytes() == before  # copied out: the pushed table's buffers are freed
    for c in got.values():
        assert (c.token_ids.nbytes + c.logprobs.nbytes + c.loss_mask.nbytes) / c.tokens == 9


def _raw(ids, logprobs, masks=None) -> pa.Table:
    n = len(ids)
    return pa.table([pa.array(["g"] * n), pa.array(range(n), pa.int32()), pa.array(ids, pa.list_(pa.int32())),
                     pa.array(logprobs, pa.list_(pa.float32())),
                     pa.array(masks or [None] * n, pa.list_(pa.int8())),
                     pa.array([1] * n, pa.int64()), pa.array([-1] * n, pa.int64())], schema=SCHEMA)


@pytest.mark.parametrize("ids, logprobs, masks, message", [
    ([[1, 2]], [[-1.0]], None, "token ids and log-probs differ in number"),
    ([[1, 2]], [[-1.0, math.nan]], None, "log-probs that are not finite"),
    ([[1], [2]], [[-1.0], [-math.inf]], None, "log-probs that are not finite"),
    ([[1, -2]], [[-1.0, -1.0]], None, "negative token ids"),
    ([None], [[-1.0]], None, "a sample without token ids or log-probs"),
    ([[1, None]], [[-1.0, -1.0]], None, "null token ids or log-probs"),
    ([[1, 2]], [[-1.0, -1.0]], [[1]], "loss mask and token ids differ in number"),
])
def test_bad_values_are_refused(ids, logprobs, masks, message):
    with pytest.raises(DataError, match=message):
        columns_of(_raw(ids, logprobs, masks))


def test_a_sample_without_a_version_is_refused():
    table = _raw([[1]], [[-1.0]])
    table = table.set_column(SCHEMA.get_field_index("policy_version"), "policy_version",
                             pa.array([None], pa.int64()))
    with pytest.raises(DataError, match="a sample whose policy_version is null"):
        columns_of(table)


def test_an_empty_table_is_no_group_and_a_foreign_one_is_refused():
    assert columns_of(to_table({})) == {}
    with pytest.raises(DataError, match="not a token-payload table"):
        columns_of(pa.table({"x": [1]}))
