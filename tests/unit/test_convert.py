"""Dataset preparation: GSM8K / generic JSONL -> verl-schema Parquet, and its errors."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from rlfleet.app.cli import main
from rlfleet.data import convert
from rlfleet.data.prompts import load_prompts
from rlfleet.errors import DataError

pytestmark = pytest.mark.unit

GSM8K = [
    {"question": "Tom has 3 apples and buys 4 more. How many?", "answer": "3+4=<<3+4=7>>7\n#### 7"},
    {"question": "Sara earns $1,200 a week. How much in 2 weeks?", "answer": "2*1200=2400\n#### 2,400"},
]


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_gsm8k_rows_follow_the_verl_schema(tmp_path):
    rows = convert.gsm8k_rows(GSM8K, "train.jsonl", split="train")
    out = convert.write_rows(rows, tmp_path / "train.parquet")
    table = pq.read_table(out)
    assert table.column_names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    first, second = table.to_pylist()
    assert first["data_source"] == "openai/gsm8k" and first["ability"] == "math"
    assert first["prompt"] == [
        {"role": "user", "content": f"{GSM8K[0]['question']} {convert.GSM8K_INSTRUCTION}"}
    ]
    assert first["reward_model"] == {"style": "rule", "ground_truth": "7"}
    assert second["reward_model"]["ground_truth"] == "2400"  # "#### 2,400": commas dropped
    assert first["extra_info"] == {
        "split": "train",
        "index": 0,
        "question": GSM8K[0]["question"],
        "answer": GSM8K[0]["answer"],
    }


def test_converted_file_loads_as_training_prompts(tmp_path, tiny_tokenizer):
    path = convert.write_rows(convert.gsm8k_rows(GSM8K, "x", instruction=""), tmp_path / "t.parquet")
    prompts, too_long = load_prompts([path], tiny_tokenizer, max_prompt_length=512)
    assert too_long == 0
    assert [(p.data_source, p.ground_truth) for p in prompts] == [
        ("openai/gsm8k", "7"),
        ("openai/gsm8k", "2400"),
    ]
    assert prompts[0].text == GSM8K[0]["question"]  # this tokenizer has no chat template: content as is


def test_missing_field_lists_the_fields_the_file_has(tmp_path):
    records = [{"q": "1+1?", "a": "2", "id": 5}]
    with pytest.raises(DataError) as err:
        convert.jsonl_rows(
            records, tmp_path / "x.jsonl", prompt_key="question", answer_key="a", data_source="s"
        )
    assert "x.jsonl has no field 'question' (--prompt-key); its fields are: q, a, id" in str(err.value)
    with pytest.raises(DataError, match="no field 'answer' .*its fields are: question, solution"):
        convert.gsm8k_rows([{"question": "q", "solution": "#### 1"}], "g.jsonl")


def test_a_record_without_the_field_is_named(tmp_path):
    records = [{"q": "a", "a": "1"}, {"q": "b"}]
    with pytest.raises(DataError, match=r"x.jsonl record 2 has no value for field 'a' \(--answer-key\)"):
        convert.jsonl_rows(records, "x.jsonl", "q", "a", "s")


def test_gsm8k_answer_without_final_marker_is_an_error():
    with pytest.raises(DataError, match=r"g.jsonl record 1: field 'answer' has no '#### N'"):
        convert.gsm8k_rows([{"question": "q", "answer": "it is 4"}], "g.jsonl")


def test_bad_json_line_is_named(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"q": 1}\n\n{"q": 2,\n')
    with pytest.raises(DataError, match=r"bad.jsonl line 3 is not valid JSON"):
        convert.read_jsonl(path)
    path.write_text("[1, 2]\n")
    with pytest.raises(DataError, match=r"bad.jsonl line 1 is a JSON list, not an object"):
        convert.read_jsonl(path)
    with pytest.raises(DataError, match="does not exist"):
        convert.read_jsonl(tmp_path / "missing.jsonl")


def test_jsonl_rows_keep_message_lists_and_stringify_answers():
    records = [
        {"msgs": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}], "label": 4}
    ]
    (row,) = convert.jsonl_rows(records, "x", "msgs", "label", data_source="mine", instruction="Answer:")
    assert row["prompt"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "2+2? Answer:"},
    ]
    assert row["reward_model"]["ground_truth"] == "4" and row["data_source"] == "mine"
    with pytest.raises(DataError, match="record 1: the prompt must be a string or a list of chat messages"):
        convert.jsonl_rows([{"p": 3, "a": "x"}], "x", "p", "a", "s")


def test_filter_by_length_counts_and_never_truncates(tiny_tokenizer):
    rows = [convert.make_row("s", [{"role": "user", "content": "a" * n}], "g", "1", {}) for n in (5, 30, 10)]
    kept, dropped = convert.filter_by_length(rows, tiny_tokenizer, max_prompt_length=10)
    assert dropped == 1
    assert [r["prompt"][0]["content"] for r in kept] == ["a" * 5, "a" * 10]


def test_cli_mismatched_field_is_one_clear_line(tmp_path, capsys):
    src = write_jsonl(tmp_path / "train.jsonl", GSM8K)
    code = main(
        [
            "data",
            "jsonl",
            "--input",
            str(src),
            "--output",
            str(tmp_path / "o.parquet"),
            "--prompt-key",
            "prompt",
            "--answer-key",
            "answer",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip() == (
        f"rlfleet: error: {src} has no field 'prompt' (--prompt-key); its fields are: question, answer"
    )
    assert not (tmp_path / "o.parquet").exists()


def test_cli_gsm8k_writes_parquet(tmp_path, capsys):
    src = write_jsonl(tmp_path / "train.jsonl", GSM8K)
    assert (
        main(["data", "gsm8k", "-i", str(src), "-o", str(tmp_path / "o.parquet"), "--instruction", ""]) == 0
    )
    assert "wrote 2 rows" in capsys.readouterr().out
    assert pq.read_table(tmp_path / "o.parquet").num_rows == 2
