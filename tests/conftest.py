"""Shared fixtures: a tiny random causal LM with its own tokenizer, built once per session."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

SPECIAL_TOKENS = ["[UNK]", "[PAD]", "[EOS]"]
# One token per character, spelled as byte-level symbols ("Ġ" is the space, "Ċ" the newline):
# transformers loads any Qwen2 model folder's tokenizer as a byte-level BPE (Qwen2Tokenizer),
# so the tokenizer is built that way from the start and behaves the same before and after saving.
TINY_SYMBOLS = ["Ġ", "Ċ", *"0123456789abcdefghijklmnopqrstuvwxyz", *"+-*/=?:.,!()[]<>#'_;%&@"]
TINY_VOCAB_SIZE = 64


def pytest_configure(config: pytest.Config) -> None:
    # `make test` runs two pytest-xdist workers on a 2-core machine: one torch (OpenMP) thread each, and
    # for the commands they start, so that the workers do not run many spinning threads on two cores.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.setdefault("OMP_NUM_THREADS", "1")


def build_tiny_model_dir(path: Path) -> Path:
    """A 2-layer Qwen2 model with random weights and a 64-token char-level tokenizer."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + TINY_SYMBOLS)}
    assert len(vocab) == TINY_VOCAB_SIZE, len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                                        eos_token="[EOS]", clean_up_tokenization_spaces=False)
    eos_id, pad_id = vocab["[EOS]"], vocab["[PAD]"]
    config = Qwen2Config(
        vocab_size=TINY_VOCAB_SIZE, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, head_dim=32, intermediate_size=128, max_position_embeddings=128,
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=eos_id, pad_token_id=pad_id)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = eos_id
    model.generation_config.pad_token_id = pad_id
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny_model"))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def pytest_sessionstart(session: pytest.Session) -> None:
    # The temp folder's room, written even under -q (CI's flags hide the header); once, not by each worker
    from tests.disk_room import temp_room_line

    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and not hasattr(session.config, "workerinput"):
        line = temp_room_line()
        reporter.write_line(line, yellow=line.startswith("WARNING"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Longest files first, so that pytest-xdist's workers finish together (tests/scheduling.py).
    from tests.scheduling import longest_files_first

    items[:] = longest_files_first(items)
