"""Tiny built-in model, built-in task rows, and the digits / gsm8k reward functions."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from rlfleet.data import tasks
from rlfleet.models import tiny
from services.reward.fns import digits as digits_reward
from services.reward.fns import final_number as lenient_reward

# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def tokenizer():
    return tiny.build_tokenizer()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # A handful of warm-start steps keeps this fast; the recipe's full warm-start
    # is exercised by the default job, not by unit tests.
    return tiny.build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0, sft_steps=4)


# --------------------------------------------------------------------------- tokenizer


def test_digits_are_single_tokens(tokenizer):
    for d in "0123456789":
        ids = tokenizer.encode(d, add_special_tokens=False)
        assert len(ids) == 1, d
        assert tokenizer.decode(ids) == d
    ids = tokenizer.encode("9876543210", add_special_tokens=False)
    assert tokenizer.convert_ids_to_tokens(ids) == list("9876543210")


def test_tokenizer_round_trips_chat_text(tokenizer):
    messages = [{"role": "user", "content": "Reverse the digits: 40721"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nReverse the digits: 40721<|im_end|>\n<|im_start|>assistant\n"
    full = text + "12704" + tokenizer.eos_token
    ids = tokenizer.encode(full, add_special_tokens=False)
    assert tokenizer.decode(ids) == full
    # The answer digits follow the generation prompt as one token each.
    n_prompt = len(tokenizer.encode(text, add_special_tokens=False))
    assert ids[n_prompt:] == tokenizer.convert_tokens_to_ids(list("12704")) + [tokenizer.eos_token_id]
    # Arbitrary text round-trips too (byte-level BPE).
    for s in ["hello world 123", "  odd\tspacing\n", "ünïcödé $1,000.50"]:
        assert tokenizer.decode(tokenizer.encode(s, add_special_tokens=False)) == s


def test_special_tokens(tokenizer):
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token_id is not None and tokenizer.eos_token_id is not None
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    assert tokenizer.bos_token_id is not None
    ids = tokenizer.encode("12" + tokenizer.eos_token, add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=True) == "12"


# --------------------------------------------------------------------------- model


def test_model_loads_with_auto_classes(model_dir, tokenizer):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert (model_dir / "model.safetensors").is_file()
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    cfg = model.config
    assert cfg.model_type == "qwen2"
    assert cfg.hidden_size == 128 and cfg.num_hidden_layers == 2
    assert cfg.num_attention_heads == 2 and cfg.num_key_value_heads == 2
    assert cfg.hidden_size // cfg.num_attention_heads == 64  # head_dim 64 (vLLM CPU)
    assert getattr(cfg, "head_dim", 64) == 64
    assert cfg.max_position_embeddings == 256
    assert cfg.vocab_size == len(tok) == len(tokenizer)
    assert cfg.eos_token_id == tok.eos_token_id
    assert cfg.pad_token_id == tok.pad_token_id
    assert cfg.bos_token_id == tok.bos_token_id
    assert model.generation_config.eos_token_id == tok.eos_token_id
    assert model.generation_config.pad_token_id == tok.pad_token_id
    assert tok.chat_template == tiny.CHAT_TEMPLATE
    assert tok.encode("Reverse the digits: 1", add_special_tokens=False) == tokenizer.encode(
        "Reverse the digits: 1", add_special_tokens=False
    )

    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Reverse the digits: 123"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    enc = tok([prompt], return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=3, do_sample=False)
    assert out.shape[1] <= enc["input_ids"].shape[1] + 3


def test_ensure_tiny_model_caches_and_locks(tmp_path, monkeypatch):
    calls = []
    real_build = tiny.build_in_child

    def short_build(out_dir, seed=0):  # the real build, without the warm start's SFT steps
        calls.append(out_dir)
        return real_build(out_dir, seed=seed, sft_steps=0)

    monkeypatch.setattr(tiny, "build_in_child", short_build)
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(tiny.ensure_tiny_model(tmp_path))) for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1  # second caller waited on the lock, then reused the build
    assert results[0] == results[1]
    path = results[0]
    assert path.parent == tmp_path
    assert tiny.recipe_hash() in path.name
    assert (path / "config.json").is_file() and (path / "tokenizer.json").is_file()
    # No temporary build folders are left behind.
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == [path.name]
    assert tiny.ensure_tiny_model(tmp_path) == path and len(calls) == 1

    monkeypatch.setenv("RLFLEET_CACHE", str(tmp_path))
    assert tiny.ensure_tiny_model() == path and len(calls) == 1


def test_the_first_build_leaves_no_torch_in_the_process_that_asked(tmp_path):
    # The launcher of a first `rlfleet run` builds the model and then runs the whole job: torch,
    # transformers and the warm start's buffers would stay in it (~650 MB instead of ~150 MB).
    script = textwrap.dedent("""
        import functools, sys
        from pathlib import Path
        from rlfleet.models import tiny
        tiny.build_in_child = functools.partial(tiny.build_in_child, sft_steps=0)
        path = tiny.ensure_tiny_model(Path(sys.argv[1]))
        assert (path / "model.safetensors").is_file(), path
        print(sorted(m for m in ("torch", "transformers") if m in sys.modules))
    """)
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                          timeout=300, cwd=Path(tiny.__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_a_failed_build_is_an_error_naming_it(tmp_path):
    (tmp_path / "out").write_text("a file where the build's folder should go")
    with pytest.raises(RuntimeError, match="building the tiny model"):
        tiny.build_in_child(tmp_path / "out", sft_steps=0)


# --------------------------------------------------------------------------- task rows


def test_task_rows_schema_and_determinism(tmp_path):
    import pyarrow.parquet as pq

    rows = tasks.make_rows(20, seed=3)
    assert rows == tasks.make_rows(20, seed=3)
    assert rows != tasks.make_rows(20, seed=4)
    for i, row in enumerate(rows):
        assert row["data_source"] == tasks.TASK_NAME
        assert row["prompt"][0]["role"] == "user"
        content = row["prompt"][0]["content"]
        number = content[len(tasks.PROMPT_PREFIX) :]
        assert content.startswith(tasks.PROMPT_PREFIX) and number.isdigit()
        assert row["reward_model"] == {"style": "rule", "ground_truth": number[::-1]}
        assert row["extra_info"] == {"index": i, "split": "train"}
        assert isinstance(row["ability"], str)

    path = tasks.write_parquet(tmp_path / "train.parquet", 20, seed=3)
    assert pq.read_table(path).to_pylist() == rows


def test_sft_pairs_noise():
    clean = tasks.make_sft_pairs(200, seed=0, noise=0.0)
    for prompt, answer in clean:
        assert answer == prompt[len(tasks.PROMPT_PREFIX) :][::-1]
    noisy = tasks.make_sft_pairs(200, seed=0, noise=0.7)
    scores = [
        digits_reward.compute_score(tasks.TASK_NAME, a, p[len(tasks.PROMPT_PREFIX) :][::-1]) for p, a in noisy
    ]
    mean = sum(scores) / len(scores)
    assert 0.25 < mean < 0.5  # expected 1 - 0.7 * 0.9 = 0.37 per digit


# --------------------------------------------------------------------------- digits reward


@pytest.mark.parametrize(
    "solution, truth, expected",
    [
        ("1274", "1274", 1.0),  # exact
        (" 1274<|im_end|>\n", "1274", 1.0),  # whitespace and special-token text ignored
        ("1264", "1274", 0.75),  # one wrong digit of four
        ("127", "1274", 0.75),  # missing digit: 3 matches / max(3, 4)
        ("12745", "1274", 0.8),  # extra digit: 4 matches / max(5, 4)
        ("4721", "1274", 0.0),  # the unreversed input: no position matches
        ("7", "1274", 0.0),  # first digit wrong, rest missing
        ("1274 and 9999", "1274", 1.0),  # only the first digit run is the answer
        ("abc", "1274", 0.0),  # garbage
        ("", "1274", 0.0),  # empty
        ("\x00\ufffd%%", "1274", 0.0),  # binary-ish garbage
        ("1274", "", 0.0),  # no ground truth digits
        ("00", "0", 0.5),  # 1 match / max(2, 1)
        ("1274", 1274, 1.0),  # integer ground truth is accepted
    ],
)
def test_digits_reward(solution, truth, expected):
    assert digits_reward.compute_score(tasks.TASK_NAME, solution, truth) == pytest.approx(expected)


def test_digits_reward_never_raises():
    for bad in [None, 123, b"12", ["1"], "٣٤٥"]:  # non-str, bytes, Arabic-Indic digits
        assert digits_reward.compute_score(tasks.TASK_NAME, bad, "123") == 0.0
    assert digits_reward.compute_score(tasks.TASK_NAME, "123", None) == 0.0  # "None" has no digits
    for s in ["9" * 10_000, "x" * 10_000]:
        assert 0.0 <= digits_reward.compute_score(tasks.TASK_NAME, s, "999") <= 1.0


# --------------------------------------------------------------------------- gsm8k reward


@pytest.mark.parametrize(
    "solution, expected_answer",
    [
        ("She pays 3 * 24 = 72 dollars.\n#### 72", "72"),  # after ####
        ("#### $1,234.00", "1234.00"),  # $ and commas stripped
        ("so 5 + 13 = 18.", "18"),  # last number, trailing period dropped
        ("#### 5 then 7", "5"),  # the number right after the marker wins
        ("first #### 1 second #### 2", "2"),  # the last marker wins
        ("It drops to -3 degrees", "-3"),  # negative
        ("costs $0.50 each", "0.50"),
        ("no numbers here", None),
        ("#### none", None),  # marker without a number
        ("", None),
    ],
)
def test_gsm8k_extraction(solution, expected_answer):
    assert lenient_reward.extract_answer(solution) == expected_answer


@pytest.mark.parametrize(
    "solution, truth, expected",
    [
        ("3 * 24 = 72\n#### 72", "72", 1.0),  # exact
        ("#### $1,234.00", "1234", 1.0),  # 1234.00 == 1234 by value
        ("The answer is 1,234", "1,234", 1.0),  # ground truth normalised too
        ("so the total is 18.", "18", 1.0),  # no marker: last number
        ("I had 3 apples and ate 5", "3", 0.0),  # last number 5 is wrong
        ("#### 71", "72", 0.0),  # wrong
        ("#### 72", "Janet ... = 72\n#### 72", 1.0),  # raw GSM8K answer as ground truth
        ("", "72", 0.0),  # empty
        ("garbage ###", "72", 0.0),  # garbage
    ],
)
def test_gsm8k_reward(solution, truth, expected):
    assert lenient_reward.compute_score("openai/gsm8k", solution, truth) == expected


def test_gsm8k_format_score():
    # Wrong but well-formed answer earns format_score; no answer at all earns 0.
    assert lenient_reward.compute_score("gsm8k", "#### 71", "72", format_score=0.1) == 0.1
    assert lenient_reward.compute_score("gsm8k", "no answer", "72", format_score=0.1) == 0.0
    assert lenient_reward.compute_score("gsm8k", "#### 72", "72", format_score=0.1) == 1.0
    assert lenient_reward.compute_score("gsm8k", None, "72") == 0.0
