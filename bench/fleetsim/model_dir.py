"""The simulator's model folder: a config and a tokenizer, no weights (no process loads a model).

The controller renders and measures prompts with the tokenizer and checks prompt + response
against the config's context; joining replicas must present the same identity
(rlfleet.models.identity). The built-in tiny model's context (256) is too short for ~300-token
responses, hence a folder of its own with a 2,048-token context and a char-level tokenizer.
"""
from __future__ import annotations

import json
from pathlib import Path

SPECIAL = ["[UNK]", "[PAD]", "[EOS]"]
SYMBOLS = ["Ġ", "Ċ", *"0123456789abcdefghijklmnopqrstuvwxyz", *"+-*/=?:.,!()[]<>#'_;%&@"]
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant: {% endif %}")
CONTEXT = 2048


def build_sim_model_dir(path: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    path.mkdir(parents=True, exist_ok=True)
    vocab = {tok: i for i, tok in enumerate(SPECIAL + SYMBOLS)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "pad_token": "[PAD]",
        "eos_token": "[EOS]", "chat_template": CHAT_TEMPLATE, "model_max_length": CONTEXT}))
    (path / "config.json").write_text(json.dumps({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": len(vocab),
        "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
        "intermediate_size": 128, "max_position_embeddings": CONTEXT, "eos_token_id": vocab["[EOS]"],
        "pad_token_id": vocab["[PAD]"], "tie_word_embeddings": False, "torch_dtype": "bfloat16"}))
    return path
