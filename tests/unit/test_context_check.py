"""Prompt + response lengths checked against the model's context (rlfleet/models/context.py)."""
from __future__ import annotations

import json

import pytest

from rlfleet.errors import ConfigError
from rlfleet.models.context import FALLBACK_PROMPT_LENGTH, resolve_prompt_length

pytestmark = pytest.mark.unit


@pytest.fixture()
def model_256(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", "max_position_embeddings": 256}))
    return tmp_path


def test_unset_prompt_length_is_what_the_context_leaves(model_256):
    assert resolve_prompt_length(None, 56, model_256, "m") == 200  # 256 - 56


def test_explicit_prompt_length_that_fits_is_kept(model_256):
    assert resolve_prompt_length(200, 56, model_256, "m") == 200  # exactly 256


def test_too_long_names_both_keys_and_the_model(model_256):
    with pytest.raises(ConfigError) as err:
        resolve_prompt_length(512, 8, model_256, "builtin:tiny")
    msg = str(err.value)
    assert "data.max_prompt_length (512) + rollout.max_new_tokens (8) = 520" in msg
    assert "context of 256" in msg and "max_position_embeddings of model.path=builtin:tiny" in msg
    assert "at most 248" in msg


def test_response_alone_too_long(model_256):
    with pytest.raises(ConfigError, match=r"rollout.max_new_tokens \(256\) leaves no room"):
        resolve_prompt_length(None, 256, model_256, "m")


def test_vllm_max_model_len_caps_the_context(model_256):
    assert resolve_prompt_length(None, 20, model_256, "m", max_model_len=100) == 80
    with pytest.raises(ConfigError, match="rollout.max_model_len"):
        resolve_prompt_length(90, 20, model_256, "m", max_model_len=100)


def test_model_without_context_length(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "x"}))
    assert resolve_prompt_length(None, 8, tmp_path, "m") == FALLBACK_PROMPT_LENGTH
    assert resolve_prompt_length(700, 8, tmp_path, "m") == 700


def test_eval_key_is_named(model_256):
    with pytest.raises(ConfigError, match=r"--max-new-tokens \(300\)"):
        resolve_prompt_length(None, 300, model_256, "m", new_tokens_key="--max-new-tokens")
