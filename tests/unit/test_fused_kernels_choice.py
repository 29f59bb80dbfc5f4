"""`learner.fused_kernels`: where Liger's kernels cannot run, `auto` keeps transformers' modules and
`liger` refuses with one error naming the key and the reason (the kernels themselves:
tests/gpu/test_fused_kernels.py)."""
from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from rlfleet.errors import ConfigError
from services.learner.fused_kernels import apply_fused_kernels, liger_unavailable_reason

pytestmark = pytest.mark.unit

TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1)


def test_on_the_cpu_auto_keeps_the_model_and_liger_names_the_key():
    model = LlamaForCausalLM(LlamaConfig(**TINY))
    norm_forward = model.model.norm.forward
    assert apply_fused_kernels(model, "auto", torch.device("cpu")) == "none"
    assert apply_fused_kernels(model, "none", torch.device("cpu")) == "none"
    assert model.model.norm.forward == norm_forward  # untouched
    with pytest.raises(ConfigError, match=r"learner.fused_kernels=liger: .*CUDA only"):
        apply_fused_kernels(model, "liger", torch.device("cpu"))


def test_unsupported_architectures_are_named():
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    assert "model type 'gpt2'" in liger_unavailable_reason(model, torch.device("cuda"))


def test_the_sharded_learner_refuses_liger_instead_of_ignoring_it():
    """learner.world_size > 1 runs the FSDP learner, which does not swap in Liger's kernels: asking
    for them there is one clear config error, not a silent no-op."""
    from rlfleet.config import LearnerConfig

    with pytest.raises(ValueError, match="learner.fused_kernels"):
        LearnerConfig(world_size=2, fused_kernels="liger")
    assert LearnerConfig(world_size=2, fused_kernels="auto").fused_kernels == "auto"
