"""Shares of one GPU shared by the rollout and the learner, chosen from the memory plan when unset
(rlfleet.memory_plan.resolve_shares, rlfleet.app.gpu_plan's rollout_plan / learner_plan), with the
GPU's size as a parameter: no GPU is needed, and both processes reach the same answer from the job."""
from __future__ import annotations

from pathlib import Path

import pytest

from rlfleet.errors import ConfigError
from rlfleet.memory_plan import GIB, MAX_SHARES, Shape, resolve_shares

REPO = Path(__file__).resolve().parents[2]
# SmolLM2-135M's config.json (the parts the plan reads)
SMOL = Shape.from_config({"num_hidden_layers": 30, "hidden_size": 576, "intermediate_size": 1536,
                          "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
                          "tie_word_embeddings": True, "max_position_embeddings": 8192})
# what torch reports for an 80 GB H100 (0.3 of it was "23.8 GiB" in the device machine's error) and
# for a 141 GB H200 (0.6 of it 83.9 GiB in ../shared/FACTS.md)
H100, H200 = int(79.2 * GIB), int(139.8 * GIB)
# the rollout's estimate for the 135M job with max_new_tokens=128 (the error's "about 26.9 GiB")
NEED_135M = int(26.9 * GIB)


def job(*overrides: str):
    from rlfleet.config import load_config

    return load_config(str(REPO / "deploy/configs/gsm8k-smollm2-135m.yaml"),
                       ["rollout.max_new_tokens=128", *overrides])


# -- the pure rule ---------------------------------------------------------------------------------

def test_unset_shares_give_the_rollout_its_need_and_the_learner_the_rest() -> None:
    # 26.9 x 1.05 (ROLLOUT_HEADROOM) / 79.2 = 0.3567 -> 0.36 (whole percents, up); the learner:
    # min(0.60, 0.95 - 0.36) = 0.59 (the one-GPU job ran on an H100 at 0.36 / 0.55, 2026-12-05)
    on_h100 = resolve_shares(None, None, shared=True, rollout_need_bytes=NEED_135M, gpu_bytes=H100)
    assert (on_h100.rollout, on_h100.learner) == (0.36, 0.59)
    assert "26.9 GiB" in on_h100.why
    # a larger need: 40 x 1.05 / 79.2 = 0.530 -> 0.54, the learner 0.95 - 0.54 = 0.41
    big = resolve_shares(None, None, shared=True, rollout_need_bytes=40 * GIB, gpu_bytes=H100)
    assert (big.rollout, big.learner) == (0.54, 0.41)


def test_on_a_large_gpu_the_measured_defaults_stay() -> None:
    on_h200 = resolve_shares(None, None, shared=True, rollout_need_bytes=NEED_135M, gpu_bytes=H200)
    assert (on_h200.rollout, on_h200.learner) == (0.30, 0.60)
    # no estimate (the vLLM engine sizes its own KV cache): the defaults
    vllm = resolve_shares(None, None, shared=True, rollout_need_bytes=None, gpu_bytes=H100)
    assert (vllm.rollout, vllm.learner) == (0.30, 0.60)


def test_set_shares_are_kept_and_only_an_unset_one_derived() -> None:
    both = resolve_shares(0.36, 0.55, shared=True, rollout_need_bytes=NEED_135M, gpu_bytes=H100)
    assert (both.rollout, both.learner) == (0.36, 0.55)
    # the learner's unset share: what the rollout's leaves, at most the default
    assert resolve_shares(0.36, None, True, NEED_135M, H100)[:2] == (0.36, 0.59)
    assert resolve_shares(0.2, None, True, NEED_135M, H100)[:2] == (0.2, 0.60)
    # the rollout's unset share: its need (at least the default), at most what the learner's leaves
    assert resolve_shares(None, 0.55, True, NEED_135M, H100)[:2] == (0.36, 0.55)
    assert resolve_shares(None, 0.7, True, NEED_135M, H200)[:2] == (0.25, 0.7)
    capped = resolve_shares(None, 0.65, True, NEED_135M, H100)  # wants 0.36, 0.30 is left
    assert capped[:2] == (0.30, 0.65) and "what learner.gpu_memory_utilization=0.65 leaves" in capped.why
    # a GPU of its own for each: as before
    assert resolve_shares(None, None, False, NEED_135M, H100)[:2] == (0.85, 1.0)
    assert resolve_shares(0.5, 0.9, False, NEED_135M, H100)[:2] == (0.5, 0.9)


def test_set_shares_over_the_sum_are_refused_as_before() -> None:
    with pytest.raises(ConfigError, match=r"rollout.gpu_memory_utilization \(0.5\) \+ "
                                          r"learner.gpu_memory_utilization \(0.6\) = 1\.1"):
        resolve_shares(0.5, 0.6, True, NEED_135M, H100)
    # a set share that leaves the other nothing
    with pytest.raises(ConfigError, match=r"rollout.gpu_memory_utilization \(0.95\) leaves .*learner"):
        resolve_shares(MAX_SHARES, None, True, NEED_135M, H100)
    with pytest.raises(ConfigError, match=r"learner.gpu_memory_utilization \(0.96\) leaves the rollout"):
        resolve_shares(None, 0.96, True, NEED_135M, H100)


# -- the plans of the 135M job, as each process makes them -------------------------------------------

def test_the_135m_job_fits_an_h100_with_derived_shares() -> None:
    from rlfleet.app.gpu_plan import learner_plan, rollout_plan

    cfg = job()
    rollout_shares, need = rollout_plan(cfg, SMOL, 2, H100, shared=True)
    assert round(sum(need.values()) / GIB, 1) == 26.9  # the device machine's figure
    learner_shares, learner_cfg, _ = learner_plan(cfg, cfg.learner, SMOL, 2, H100, shared=True)
    # both processes reach the same shares from the job
    assert rollout_shares == learner_shares
    assert (rollout_shares.rollout, rollout_shares.learner) == (0.36, 0.59)
    assert learner_cfg.micro_batch_tokens == 32768


def test_the_135m_job_keeps_the_defaults_on_an_h200() -> None:
    from rlfleet.app.gpu_plan import learner_plan, rollout_plan

    cfg = job()
    rollout_shares, _ = rollout_plan(cfg, SMOL, 2, H200, shared=True)
    learner_shares, _, _ = learner_plan(cfg, cfg.learner, SMOL, 2, H200, shared=True)
    assert rollout_shares == learner_shares
    assert (rollout_shares.rollout, rollout_shares.learner) == (0.30, 0.60)


def test_user_shares_are_kept_by_the_plans() -> None:
    from rlfleet.app.gpu_plan import learner_plan, rollout_plan

    cfg = job("rollout.gpu_memory_utilization=0.36", "learner.gpu_memory_utilization=0.55")
    rollout_shares, _ = rollout_plan(cfg, SMOL, 2, H100, shared=True)
    learner_shares, _, _ = learner_plan(cfg, cfg.learner, SMOL, 2, H100, shared=True)
    assert (rollout_shares.rollout, learner_shares.learner) == (0.36, 0.55)
    # the set default (0.30) is too small on an H100, as the device machine said
    low = job("rollout.gpu_memory_utilization=0.3")
    with pytest.raises(ConfigError, match=r"rollout.gpu_memory_utilization=0.3 of this 79 GiB GPU gives it "
                                          r"23.8 GiB; raise rollout.gpu_memory_utilization"):
        rollout_plan(low, SMOL, 2, H100, shared=True)


def test_a_rollout_too_big_for_the_gpu_is_refused_naming_the_keys() -> None:
    from rlfleet.app.gpu_plan import rollout_plan

    cfg = job("rollout.max_batch_sequences=1024", "rollout.max_new_tokens=2048")
    with pytest.raises(ConfigError) as err:
        rollout_plan(cfg, SMOL, 2, H100, shared=True)
    text = str(err.value)
    assert "the rollout needs about" in text and "rollout.max_batch_sequences" in text
    assert "rollout.max_new_tokens" in text and "data.max_prompt_length" in text
    # no share could hold it beside a learner: the message does not ask for a larger one
    assert "rollout.gpu_memory_utilization=0.95 (the most it can take beside the learner)" in text
    assert "raise rollout.gpu_memory_utilization" not in text


def test_a_learner_that_cannot_fit_what_is_left_is_refused_naming_the_keys() -> None:
    from rlfleet.app.gpu_plan import learner_plan

    # 1024 sequences double the rollout's KV cache: 52.5 GiB x 1.05 of 79.2 = 0.696 -> 0.70 of the H100;
    # the learner keeps 0.25 (19.8 GiB), too little for 32768-token micro-batches without checkpointing and
    # with whole-batch logits (55.0 GiB)
    cfg = job("rollout.max_batch_sequences=1024", "learner.logprob_chunk_tokens=0")
    with pytest.raises(ConfigError) as err:
        learner_plan(cfg, cfg.learner, SMOL, 2, H100, shared=True)
    text = str(err.value)
    assert "the learner needs about" in text and "learner.gpu_memory_utilization=0.25 (unset" in text
    assert "learner.micro_batch_tokens" in text and "learner.gradient_checkpointing" in text
