"""The one-GPU memory plan (rlfleet.memory_plan): estimates derived by hand, shares, and the errors
that name the keys and the sizes before any model is loaded."""
from __future__ import annotations

import pytest

from rlfleet.errors import ConfigError
from rlfleet.memory_plan import (AUTO_MICRO_BATCH_MAX, GIB, Shape, check, largest_micro_batch, learner_bytes,
                                 resolve_shares, rollout_bytes)

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
    # without an estimate (the shares derived from one: tests/unit/test_shared_gpu_shares.py)
    assert resolve_shares(None, None, shared=True)[:2] == (0.30, 0.60)
    assert resolve_shares(None, None, shared=False)[:2] == (0.85, 1.0)
    assert resolve_shares(0.2, 0.7, shared=True)[:2] == (0.2, 0.7)
    with pytest.raises(ConfigError, match=r"rollout.gpu_memory_utilization \(0.5\) \+ "
                                          r"learner.gpu_memory_utilization \(0.6\) = 1\.1"):
        resolve_shares(0.5, 0.6, shared=True)


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


# A small shape whose estimate is easy to follow by hand: params = embed 1000*64 = 64,000; per layer
# q,k,v,o 4*64*(4*16) = 16,384, mlp 3*64*128 = 24,576, norms 128 -> 41,088 x 2 = 82,176; final norm 64
SMALL = Shape(layers=2, hidden=64, intermediate=128, heads=4, kv_heads=4, head_dim=16, vocab=1000, tied=True,
              context=2048)
# fixed part of the learner's estimate in bf16: weights, gradients, two moments and the push buffer
# (5 x 146,240 x 2 B = 1,462,400) + the CUDA context (536,870,912) = 538,333,312 B
FIXED = 5 * 146_240 * 2 + GIB // 2
# per token without checkpointing: 2 layers x (16*64 + 6*128) x 2 B = 7,168 B of activations, and with
# whole-batch logits 3 x 1000 x 4 B = 12,000 B more


def test_small_shape_by_hand() -> None:
    assert SMALL.params == 64_000 + 82_176 + 64 == 146_240
    need = learner_bytes(SMALL, 2, micro_batch_tokens=1024, checkpointing=False, logprob_chunk_tokens=0)
    assert sum(need.values()) == FIXED + 1024 * (7_168 + 12_000)


def test_the_largest_micro_batch_that_fits_by_hand() -> None:
    # 4096 tokens: FIXED + 4096 * 19,168 = 616,845,440 B fits 620,000,000; 5120: 636,473,472 does not
    assert largest_micro_batch(SMALL, 2, 620_000_000, checkpointing=False, logprob_chunk_tokens=0) == 4096
    # chunked log-probs (1024 tokens of logits at a time: 12,288,000 B whatever the micro-batch): the
    # activations may take 620,000,000 - FIXED - 12,288,000 = 69,378,688 B = 9,679 tokens of 7,168 B -> 9216
    assert largest_micro_batch(SMALL, 2, 620_000_000, checkpointing=False, logprob_chunk_tokens=1024) == 9216
    # room for far more than the cap: the cap; room for not even 1024 tokens: None
    assert largest_micro_batch(SMALL, 2, 100 * GIB, checkpointing=False, logprob_chunk_tokens=0) \
        == AUTO_MICRO_BATCH_MAX == 32768
    assert largest_micro_batch(SMALL, 2, FIXED + 1023 * 19_168, checkpointing=False,
                               logprob_chunk_tokens=0) is None


def test_an_unset_micro_batch_is_chosen_and_a_set_one_kept() -> None:
    from rlfleet.app.gpu_plan import with_micro_batch
    from rlfleet.learner_config import LearnerConfig

    chosen = with_micro_batch(LearnerConfig(), SMALL, 2, 620_000_000, logprob_chunk_tokens=0)
    assert chosen.micro_batch_tokens == 4096
    mine = LearnerConfig(micro_batch_tokens=32768)
    assert with_micro_batch(mine, SMALL, 2, 620_000_000, logprob_chunk_tokens=0).micro_batch_tokens == 32768
    # nothing fits: left unset, so the plan's check refuses the default with its sizes as before
    unfit = with_micro_batch(LearnerConfig(), SMALL, 2, FIXED, logprob_chunk_tokens=0)
    assert unfit.micro_batch_tokens is None


def test_a_set_micro_batch_that_does_not_fit_is_refused_as_before() -> None:
    need = learner_bytes(SMALL, 2, micro_batch_tokens=32768, checkpointing=False, logprob_chunk_tokens=0)
    with pytest.raises(ConfigError, match=r"the learner needs about .* GiB .*learner.gpu_memory_utilization"):
        check("the learner", need, 0.5, int(1.2 * GIB), "learner.gpu_memory_utilization",
              "learner.micro_batch_tokens")


def test_master_weights_in_the_learner_estimate_by_hand() -> None:
    # bfloat16 weights with float32 masters (services/learner/master_weights.py): AdamW's two moments in
    # float32 (8 B a parameter instead of 4) and the float32 copies plus their gradients (8 B)
    shape = Shape.from_config(SMOL)
    plain = learner_bytes(shape, 2, micro_batch_tokens=4096, checkpointing=False, logprob_chunk_tokens=0)
    master = learner_bytes(shape, 2, micro_batch_tokens=4096, checkpointing=False, logprob_chunk_tokens=0,
                           master_weights=True)
    assert master["optimizer"] == 8 * 134_515_008
    assert master["master weights"] == 8 * 134_515_008
    assert sum(master.values()) - sum(plain.values()) == 12 * 134_515_008
    from rlfleet.config import LearnerConfig

    assert LearnerConfig().master_weights_on(2) and not LearnerConfig().master_weights_on(4)
    assert not LearnerConfig(master_weights=False).master_weights_on(2)
