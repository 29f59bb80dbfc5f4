"""The learner's model FLOPs utilisation per step (`perf/learner_mfu`), as verl reports `perf/mfu/actor`:
the step's training FLOPs (6 per parameter per token, forward and backward, plus the attention's
scores and weighted sums over each sample's own length) over the step time and the GPU's dense bf16
peak. Numbers derived by hand."""
from __future__ import annotations

import pytest
from transformers import Qwen2Config

from services.learner.flops import dense_bf16_peak_flops, mfu, train_flops

pytestmark = pytest.mark.unit

# hidden 64, 2 layers, 4 heads of 16, 2 kv heads, MLP 128, vocabulary 100, lm_head tied
CONFIG = Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     intermediate_size=128, vocab_size=100, tie_word_embeddings=True)


def test_train_flops_by_hand():
    # per layer: q 64*64 + k 64*32 + v 64*32 + o 64*64 = 12,288; MLP 3*64*128 = 24,576 -> 36,864
    # two layers 73,728, plus the lm_head's 64*100 = 6,400 (it runs every token even when tied) = 80,128
    # dense: 6 * 80,128 * (3 + 5) tokens = 3,846,144
    # attention: 12 * layers 2 * heads 4 * head_dim 16 * (3^2 + 5^2) = 52,224
    assert train_flops(CONFIG, [3, 5]) == 3_846_144 + 52_224


def test_mfu_is_flops_over_time_and_peak():
    assert mfu(flops=4.0e14, seconds=2.0, peak_flops=1.0e15) == pytest.approx(0.2)


def test_peak_is_known_for_common_gpus_and_none_otherwise():
    assert dense_bf16_peak_flops("NVIDIA H200") == 989e12
    assert dense_bf16_peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert dense_bf16_peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert dense_bf16_peak_flops("Some Future Accelerator") is None


def test_a_models_linear_weights_count_as_its_config_says():
    from transformers import Qwen2ForCausalLM

    from services.learner.flops import matmul_weights

    assert matmul_weights(Qwen2ForCausalLM(CONFIG)) == 80_128
