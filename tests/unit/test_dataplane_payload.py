"""The data plane's payload table (rlfleet/dataplane/payload.py): what goes in comes out, float32
log-probs as the gRPC path's packed floats (the same bits), masks kept or null, bad input named."""
from __future__ import annotations

import struct

import pyarrow as pa
import pytest

from rlfleet.errors import DataError
from rlfleet.dataplane.payload import SCHEMA, TokenPayload, from_table, to_table

pytestmark = pytest.mark.unit


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def test_groups_round_trip_in_order_with_float32_logprobs():
    groups = {
        "p3-s7": [TokenPayload([5, 6, 7], [-0.1, -2.5, -0.3], 4, 5),
                  TokenPayload([9], [-1.0], 4, -1, loss_mask=[1])],
        "p0-s1": [TokenPayload([], [], 3)],
    }
    table = to_table(groups)
    assert table.num_rows == 3 and table.schema.equals(SCHEMA)
    back = from_table(table)
    assert list(back) == ["p3-s7", "p0-s1"]
    first = back["p3-s7"][0]
    assert first.token_ids == [5, 6, 7] and (first.policy_version, first.last_policy_version) == (4, 5)
    # -0.1 is not a float32: it comes back as float32(-0.1) = -0.10000000149011612, as over gRPC
    assert first.logprobs == [_f32(-0.1), -2.5, _f32(-0.3)] and first.logprobs[0] != -0.1
    assert first.loss_mask is None and back["p3-s7"][1].loss_mask == [1]
    assert back["p0-s1"] == [TokenPayload([], [], 3, -1, None)]


def test_from_record_batches_and_samples_in_index_order():
    table = to_table({"a": [TokenPayload([1], [-1.0], 0), TokenPayload([2], [-2.0], 0)]})
    reversed_rows = table.take([1, 0])  # sample 1 then sample 0
    back = from_table(reversed_rows.to_batches())
    assert [p.token_ids for p in back["a"]] == [[1], [2]]


def test_bad_input_is_named():
    with pytest.raises(DataError, match="p1 sample 0: 2 token ids but 1 log-probs"):
        to_table({"p1": [TokenPayload([1, 2], [-1.0], 0)]})
    with pytest.raises(DataError, match="not a token-payload table"):
        from_table(pa.table({"x": [1]}))
