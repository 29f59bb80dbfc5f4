"""The one-GPU memory plan (rlfleet.memory_plan): estimates derived by hand, shares, and the errors
that name the keys and the sizes before any model is loaded."""
from __future__ import annotations

import pytest

from rlfleet.errors import ConfigError
from rlfleet.memory_plan import GIB, Shape, check, learner_bytes, rollout_bytes, shares

# SmolLM2-135M's config.json (the parts the plan reads)
SMOL = {"num_hidden_layers": 30, "hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9,
        "num_key_value_heads": 3, "vocab_size": 49152, "tie_word_embeddings": True,
        "max_position_embeddings": 8192}


def test_parameter_count_of_smollm2_135m() -> None:
    shape = Shape.from_config(SMOL)
    assert shape.head_dim == 64  # 576 / 9
    # embed 49152*576 = 28,311,552; per layer: q,o 2*576*576 = 663,552; k,v 2*576*192 = 221,184;
    # mlp 3*576*1536 = 2,654,208; norms 1,152 -> 3,540,096 x 30 = 106,202,880; final norm 576; tied head
    assert shape.params == 28_311_552 + 106_202_880 + 576 == 134_515_008


def test_rollout_estimate_by_hand() -> None:
    need = rollout_bytes(Shape.from_config(SMOL), 2, max_batch_sequences=512, max_tokens=128 + 300)
    # batch bucket 512, length 428 -> 448; K and V: 2 * 30 * 512 * 3 * 448 * 64 * 2 B, two slots kept
    assert need["KV cache"] == 2 * 30 * 512 * 3 * 448 * 64 * 2 * 2 == 10_569_646_080
    assert need["weights"] == need["weight staging"] == 134_515_008 * 2
    # prefill 16384 tokens * (4*576 + 2*1536) * 2 B + logits 4 * 512 * 49152 * 4 B
    # logits: a decode step's output, the sampler's temporaries, and the narrowed slots' outputs
    # (finished-row compaction: 256 + 128 + ... rows, under one more full batch)
    assert need["activations"] == 16384 * (4 * 576 + 2 * 1536) * 2 + 4 * 512 * 49152 * 4


def test_learner_estimate_by_hand() -> None:
    shape = Shape.from_config(SMOL)
    plain = learner_bytes(shape, 2, micro_batch_tokens=4096, checkpointing=False, logprob_chunk_tokens=0)
    assert plain["optimizer"] == 2 * plain["weights"] == 4 * 134_515_008
    per_layer = 4096 * (16 * 576 + 6 * 1536) * 2  # 151,001,088 B
    assert plain["activations"] == 30 * per_layer
    assert plain["logits"] == 3 * 4096 * 49152 * 4
    ckpt = learner_bytes(shape, 2, micro_batch_tokens=4096, checkpointing=True, logprob_chunk_tokens=1024)
    assert ckpt["activations"] == 30 * 4096 * 576 * 2 + per_layer  # layer inputs kept + one layer's
    assert ckpt["logits"] == 3 * 1024 * 49152 * 4


def test_shares_defaults_and_their_sum() -> None:
    assert shares(None, None, shared=True) == (0.30, 0.60)
    assert shares(None, None, shared=False) == (0.85, 1.0)
    assert shares(0.2, 0.7, shared=True) == (0.2, 0.7)
    with pytest.raises(ConfigError, match=r"rollout.gpu_memory_utilization \(0.5\) \+ "
                                          r"learner.gpu_memory_utilization \(0.6\) = 1\.1"):
        shares(0.5, None, shared=True)


def test_an_oversized_rollout_is_refused_naming_keys_and_sizes() -> None:
    need = rollout_bytes(Shape.from_config(SMOL), 2, max_batch_sequences=1024, max_tokens=8192)
    with pytest.raises(ConfigError) as err:
        check("the rollout", need, 0.3, 80 * GIB, "rollout.gpu_memory_utilization",
              "rollout.max_batch_sequences, rollout.max_new_tokens or data.max_prompt_length")
    text = str(err.value)
    assert "the rollout needs about" in text and "KV cache 360.0" in text
    assert "rollout.gpu_memory_utilization=0.3 of this 80 GiB GPU gives it 24.0 GiB" in text
    assert "rollout.max_batch_sequences" in text
    check("the rollout", rollout_bytes(Shape.from_config(SMOL), 2, 256, 640), 0.3, 80 * GIB,
          "rollout.gpu_memory_utilization", "")  # the defaults of the real-model recipe fit


def test_a_config_json_without_the_shape_is_named() -> None:
    with pytest.raises(ConfigError, match="config.json lacks what the memory plan needs"):
        Shape.from_config({"hidden_size": 64})


def test_roles_share_a_gpu_as_rlfleet_run_places_them() -> None:
    from rlfleet.app.gpu_plan import roles_share_gpu
    from rlfleet.config import load_config

    one = load_config(overrides=["rollout.device=auto", "learner.device=auto"])
    assert roles_share_gpu(one, gpus=1) and not roles_share_gpu(one, gpus=2)
    assert not roles_share_gpu(one, gpus=0)
    two = load_config(overrides=["rollout.replicas=2", "rollout.device=auto", "learner.device=auto"])
    assert roles_share_gpu(two, gpus=2) and not roles_share_gpu(two, gpus=3)
    pinned = load_config(overrides=["rollout.device=cuda:1", "learner.device=cuda:1"])
    assert roles_share_gpu(pinned, gpus=2)
    remote = load_config(overrides=["rollout.address=h:1", "learner.device=auto"])
    assert not roles_share_gpu(remote, gpus=1)
