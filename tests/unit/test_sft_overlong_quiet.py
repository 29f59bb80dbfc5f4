"""`rlfleet sft` leaves out overlong rows without transformers' "Token indices sequence length is
longer than the specified maximum" warning (issue 32, from a new user: printed twice for rows it then
filtered, as if something were wrong). The tokenizer's own limit is not the filter: max_length is."""
from __future__ import annotations

import json
import logging

import pytest

from rlfleet.data import sft

pytestmark = [pytest.mark.unit]


def test_overlong_rows_are_left_out_quietly(tmp_path, capfd, caplog):
    from transformers import AutoTokenizer

    from rlfleet.models.tiny import ensure_tiny_model

    tok = AutoTokenizer.from_pretrained(ensure_tiny_model())
    tok.model_max_length = 16  # a model whose context is shorter than a row
    rows = [{"q": "1 + 1 =", "a": "2"}, {"q": "1 + 1 = " * 40, "a": "2 " * 40},
            {"q": [{"role": "user", "content": "2 + 2 = " * 40}], "a": "4"}]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with caplog.at_level(logging.WARNING):
        examples, too_long = sft.load_examples([data], tok, "q", "a", max_length=64)
    assert [e.index for e in examples] == [0] and too_long == 2
    captured = capfd.readouterr()
    said = captured.out + captured.err + caplog.text
    assert "Token indices sequence length" not in said, said
    assert tok.model_max_length == 16  # left as it was
