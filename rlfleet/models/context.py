"""Prompt and response lengths checked against the model's context, before any work starts.

A prompt of `data.max_prompt_length` tokens plus `rollout.max_new_tokens` new ones
must fit the model's context (and vLLM's `rollout.max_model_len` when set): else the
rollout refuses requests mid-run. `data.max_prompt_length` left unset takes what
the context leaves after the response.
"""
from __future__ import annotations

import json
from pathlib import Path

from rlfleet.errors import ConfigError

_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
FALLBACK_PROMPT_LENGTH = 1024  # a model whose config names no context length


def context_length(config: dict) -> tuple[int, str] | None:
    """(tokens, config key) of a model config's context length, if it states one."""
    sections = [config, config.get("text_config") or {}]
    for section in sections:
        for key in _CONTEXT_KEYS:
            value = section.get(key)
            if isinstance(value, int) and value > 0:
                return value, key
    return None


def model_context(model_dir: Path) -> tuple[int, str] | None:
    try:
        return context_length(json.loads((Path(model_dir) / "config.json").read_text()))
    except (OSError, json.JSONDecodeError):
        return None


def resolve_prompt_length(max_prompt_length: int | None, max_new_tokens: int, model_dir: Path,
                          model_name: str, max_model_len: int | None = None,
                          new_tokens_key: str = "rollout.max_new_tokens") -> int:
    """The prompt-length limit to filter data with; a clear error when prompt + response cannot fit."""
    found = model_context(model_dir)
    limit, what = (found[0], f"{found[1]} of model.path={model_name}") if found else (None, "")
    if max_model_len is not None and (limit is None or max_model_len < limit):
        limit, what = max_model_len, "rollout.max_model_len"
    if limit is None:
        return max_prompt_length if max_prompt_length is not None else FALLBACK_PROMPT_LENGTH
    if max_new_tokens >= limit:
        raise ConfigError(f"{new_tokens_key} ({max_new_tokens}) leaves no room for a prompt in the model's "
                          f"context of {limit} tokens ({what}): lower {new_tokens_key}")
    if max_prompt_length is None:
        return limit - max_new_tokens
    if max_prompt_length + max_new_tokens > limit:
        raise ConfigError(f"data.max_prompt_length ({max_prompt_length}) + {new_tokens_key} "
                          f"({max_new_tokens}) = {max_prompt_length + max_new_tokens} tokens exceed the "
                          f"model's context of {limit} ({what}): lower data.max_prompt_length to at "
                          f"most {limit - max_new_tokens} or leave it unset")
    return max_prompt_length
