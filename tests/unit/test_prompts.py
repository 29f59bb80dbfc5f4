"""Parquet prompts in the verl schema: rendering, length filtering, errors, epoch order."""
from __future__ import annotations

import itertools
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlfleet.data.prompts import Prompt, PromptSource, load_prompts, render_prompt
from rlfleet.errors import DataError

pytestmark = pytest.mark.unit


class CharTokenizer:
    """One token per character; optionally with a chat template, like an HF tokenizer."""

    def __init__(self, chat_template: bool = False):
        self.chat_template = "<fake>" if chat_template else None

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": [ord(c) for c in text]}

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False) -> str:
        body = "".join(f"<{m['role']}>{m['content']}" for m in messages)
        return body + ("<assistant>" if add_generation_prompt else "")


def verl_rows(prompts: list, source: str = "openai/gsm8k") -> dict[str, list]:
    return {
        "data_source": [source] * len(prompts),
        "prompt": prompts,
        "ability": ["math"] * len(prompts),
        "reward_model": [{"style": "rule", "ground_truth": str(i)} for i in range(len(prompts))],
        "extra_info": [{"split": "train", "index": i} for i in range(len(prompts))],
    }


def write_parquet(path: Path, columns: dict[str, list]) -> Path:
    pq.write_table(pa.table(columns), path)
    return path


def chat(text: str) -> list[dict]:
    return [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}]


def test_chat_prompts_in_verl_schema(tmp_path):
    path = write_parquet(tmp_path / "train.parquet", verl_rows([chat("1+1"), chat("2+2")]))
    prompts, too_long = load_prompts([path], CharTokenizer(chat_template=True))
    assert too_long == 0
    assert [p.text for p in prompts] == ["<system>be brief<user>1+1<assistant>",
                                         "<system>be brief<user>2+2<assistant>"]
    assert prompts[0].prompt_ids == [ord(c) for c in prompts[0].text]
    assert [p.ground_truth for p in prompts] == ["0", "1"]
    assert [p.data_source for p in prompts] == ["openai/gsm8k"] * 2
    assert [p.index for p in prompts] == [0, 1]
    assert prompts[1].extra_info == {"split": "train", "index": 1}


def test_chat_prompts_without_a_template_join_the_contents(tmp_path):
    path = write_parquet(tmp_path / "train.parquet", verl_rows([chat("3*3")]))
    prompts, _ = load_prompts([path], CharTokenizer(chat_template=False))
    assert prompts[0].text == "be brief\n3*3"


def test_plain_string_prompts_and_several_files(tmp_path):
    a = write_parquet(tmp_path / "a.parquet", verl_rows(["abc", "de"], source="digits"))
    b = write_parquet(tmp_path / "b.parquet", verl_rows([chat("x")]))
    prompts, too_long = load_prompts([a, b], CharTokenizer(chat_template=True))
    assert too_long == 0
    assert [p.text for p in prompts] == ["abc", "de", "<system>be brief<user>x<assistant>"]
    assert [p.index for p in prompts] == [0, 1, 2]
    assert [p.data_source for p in prompts] == ["digits", "digits", "openai/gsm8k"]


def test_custom_prompt_key(tmp_path):
    cols = verl_rows(["abc"])
    cols["question"] = cols.pop("prompt")
    path = write_parquet(tmp_path / "q.parquet", cols)
    prompts, _ = load_prompts([path], CharTokenizer(), prompt_key="question")
    assert prompts[0].text == "abc"


def test_ground_truth_as_json_string(tmp_path):
    cols = verl_rows(["abc"])
    cols["reward_model"] = ['{"style": "rule", "ground_truth": "42"}']
    prompts, _ = load_prompts([write_parquet(tmp_path / "j.parquet", cols)], CharTokenizer())
    assert prompts[0].ground_truth == "42"


def test_missing_column_lists_the_files_columns(tmp_path):
    cols = verl_rows(["abc"])
    del cols["reward_model"]
    path = write_parquet(tmp_path / "bad.parquet", cols)
    with pytest.raises(DataError) as info:
        load_prompts([path], CharTokenizer())
    msg = str(info.value)
    assert "bad.parquet" in msg and "'reward_model'" in msg
    for column in ("data_source", "prompt", "ability", "extra_info"):
        assert column in msg


def test_missing_prompt_key_column(tmp_path):
    path = write_parquet(tmp_path / "p.parquet", verl_rows(["abc"]))
    with pytest.raises(DataError, match=r"'question'.*columns are: data_source, prompt"):
        load_prompts([path], CharTokenizer(), prompt_key="question")


def test_non_parquet_file(tmp_path):
    path = tmp_path / "train.parquet"
    path.write_text("data_source,prompt\nx,y\n")
    with pytest.raises(DataError, match="not readable Parquet"):
        load_prompts([path], CharTokenizer())


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_prompts([tmp_path / "none.parquet"], CharTokenizer())


def test_long_prompts_are_filtered_and_counted_not_truncated(tmp_path):
    texts = ["a" * 3, "b" * 9, "c" * 5, "d" * 6, "e" * 20]
    path = write_parquet(tmp_path / "t.parquet", verl_rows(texts))
    prompts, too_long = load_prompts([path], CharTokenizer(), max_prompt_length=5)
    assert too_long == 3
    assert [p.text for p in prompts] == ["aaa", "ccccc"]  # the boundary (5 tokens) is kept whole
    assert [len(p.prompt_ids) for p in prompts] == [3, 5]
    assert [p.index for p in prompts] == [0, 2]  # the data set's row, whatever was left out before it
    assert [p.ground_truth for p in prompts] == ["0", "2"]  # each prompt keeps its own answer


def test_prompt_index_counts_rows_across_files(tmp_path):
    first = write_parquet(tmp_path / "a.parquet", verl_rows(["a" * 9, "bb"]))
    second = write_parquet(tmp_path / "b.parquet", verl_rows(["c" * 9, "dd", "ee"]))
    prompts, too_long = load_prompts([first, second], CharTokenizer(), max_prompt_length=5)
    assert too_long == 2
    # rows 0..1 are the first file's, 2..4 the second's
    assert [(p.index, p.text) for p in prompts] == [(1, "bb"), (3, "dd"), (4, "ee")]


def test_all_prompts_too_long_is_an_error(tmp_path):
    path = write_parquet(tmp_path / "t.parquet", verl_rows(["abcdef", "ghijkl"]))
    with pytest.raises(DataError, match=r"2 longer than data.max_prompt_length=3"):
        load_prompts([path], CharTokenizer(), max_prompt_length=3)


def test_render_prompt_rejects_other_types():
    with pytest.raises(DataError, match="string or a list of chat messages"):
        render_prompt(123, CharTokenizer())
    with pytest.raises(DataError):
        render_prompt([{"role": "user"}], CharTokenizer())


def make_prompts(n: int) -> list[Prompt]:
    return [Prompt(index=i, text=str(i), prompt_ids=[i], data_source="d", ground_truth=str(i))
            for i in range(n)]


def indices(source: PromptSource, count: int) -> list[int]:
    return [p.index for p in itertools.islice(source, count)]


def test_prompt_source_cycles_over_epochs_with_each_epoch_a_permutation():
    source = PromptSource(make_prompts(7), shuffle=True, seed=3)
    seen = indices(source, 21)
    epochs = [seen[0:7], seen[7:14], seen[14:21]]
    for epoch in epochs:
        assert sorted(epoch) == list(range(7))
    assert source.epoch == 2
    assert len({tuple(e) for e in epochs}) > 1  # reshuffled between epochs


def test_prompt_source_is_deterministic_for_a_seed():
    a = indices(PromptSource(make_prompts(10), shuffle=True, seed=1), 30)
    b = indices(PromptSource(make_prompts(10), shuffle=True, seed=1), 30)
    c = indices(PromptSource(make_prompts(10), shuffle=True, seed=2), 30)
    assert a == b
    assert a != c


def test_prompt_source_without_shuffle_keeps_file_order():
    source = PromptSource(make_prompts(3), shuffle=False)
    assert indices(source, 7) == [0, 1, 2, 0, 1, 2, 0]
    assert source.next().index == 1


def test_plain_string_ground_truth_that_looks_like_json(tmp_path):
    cols = verl_rows(["abc", "de"])
    cols["reward_model"] = ["42", "abc"]
    prompts, _ = load_prompts([write_parquet(tmp_path / "s.parquet", cols)], CharTokenizer())
    assert [p.ground_truth for p in prompts] == ["42", "abc"]


@pytest.mark.parametrize("template", [False, True], ids=["joined", "chat-template"])
@pytest.mark.parametrize("content", [7, [{"type": "text", "text": "hi"}]], ids=["number", "parts-list"])
def test_chat_message_with_non_string_content_names_file_row_and_column(tmp_path, template, content):
    rows = verl_rows([[{"role": "user", "content": content}]] * 3)
    path = write_parquet(tmp_path / "odd.parquet", rows)
    with pytest.raises(DataError) as info:
        load_prompts([path], CharTokenizer(chat_template=template))
    message = str(info.value)
    assert f"data file {path}, row 0, column 'prompt'" in message, message
    assert "chat message 0 has content of type" in message and "\n" not in message
