"""A model's identity for the elastic fleet: what a joining rollout replica must share with the run.

A joiner receives the run's current weights before any work, so its own weight *values* do not
matter; what must match is what those weights and the token ids mean: the architecture (every key
of config.json that shapes the network) and the tokenizer (its vocabulary and special tokens). Two
folders with the same architecture and tokenizer have the same identity whatever their weights.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from rlfleet.errors import ConfigError

# config.json keys that say nothing about the network's shape or its tokens
_IGNORED = {"_name_or_path", "transformers_version", "torch_dtype", "dtype", "use_cache"}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                    "tokenizer.model", "special_tokens_map.json")


def _config(model_dir: Path) -> dict:
    path = model_dir / "config.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"model.path {model_dir}: cannot read {path.name}: {exc}") from None


def architecture(model_dir: Path) -> dict:
    """The config.json keys that shape the network, with `tokenizer`: a hash of its tokenizer files."""
    config = {k: v for k, v in _config(model_dir).items() if k not in _IGNORED}
    tokenizer = hashlib.sha256()
    for name in _TOKENIZER_FILES:
        path = model_dir / name
        if path.is_file():
            tokenizer.update(name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return {**config, "tokenizer": tokenizer.hexdigest()[:16]}


def model_identity(model_dir: Path) -> str:
    """A short hash of the architecture and the tokenizer files of the HF folder `model_dir`."""
    return identity_of(architecture(model_dir))


def identity_of(arch: dict) -> str:
    return hashlib.sha256(json.dumps(arch, sort_keys=True).encode()).hexdigest()[:16]


def difference(ours: dict, theirs: dict, limit: int = 3) -> str:
    """`rms_norm_eps 1e-05 (here 1e-06), tokenizer` — what differs, for a refusal message."""
    keys = sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
    parts = ["tokenizer" if k == "tokenizer" else f"{k} {theirs.get(k)!r} (this run: {ours.get(k)!r})"
             for k in keys[:limit]]
    return ", ".join(parts) + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def model_summary(model_dir: Path) -> str:
    """The same in words, for a refusal message: `Qwen2ForCausalLM, 2 layers, hidden 128, vocab 292`."""
    config = _config(model_dir)
    arch = ",".join(config.get("architectures") or [config.get("model_type", "?")])
    return (f"{arch}, {config.get('num_hidden_layers', '?')} layers, "
            f"hidden {config.get('hidden_size', '?')}, vocab {config.get('vocab_size', '?')}")
