"""The learner core running each kind of algorithm on the tiny random model (CPU, no services):
PPO with a critic, micro-batch invariance of every update, off-policy metrics, LoRA with merged weights."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from rlfleet.algorithm import AlgorithmConfig, LoraConfig
from rlfleet.config import LearnerConfig
from rlfleet.types import TrainBatch, TrainSample
from services.learner.learner import Learner

pytestmark = pytest.mark.unit
CPU = torch.device("cpu")


def samples(behaviour_shift: float = 0.0) -> list[TrainSample]:
    """Two groups of two: prompts and responses of different lengths, rewards 1/0 and 0.5/0."""
    rows = [([3, 4, 5], [6, 7, 8], 1.0, 1.0), ([3, 4, 5], [9, 10], 0.0, -1.0),
            ([11, 12], [13, 14, 15, 16], 0.5, 1.0), ([11, 12], [17], 0.0, -1.0)]
    return [TrainSample(prompt_ids=p, response_ids=r, behaviour_logprobs=[-3.0 + behaviour_shift] * len(r),
                        advantage=a, generation_version=0, reward=rew) for p, r, rew, a in rows]


def learner(model_dir: Path, tmp_path: Path, micro_batch_tokens: int = 4096, lora: LoraConfig | None = None,
            **algorithm) -> Learner:
    cfg = LearnerConfig(lr=1e-2, micro_batch_tokens=micro_batch_tokens, lora=lora or LoraConfig())
    return Learner(cfg, model_dir, CPU, torch.float32, tmp_path / "ckpt", seed=0,
                   algorithm=AlgorithmConfig(**algorithm), max_response_tokens=4)


def test_ppo_trains_policy_and_critic_in_mini_batches(tiny_model_dir: Path, tmp_path: Path) -> None:
    core = learner(tiny_model_dir, tmp_path, name="ppo")
    before = copy.deepcopy(core.update.critic.model.state_dict())
    result = core.train(TrainBatch(step=1, samples=samples(), expected_version=0))
    assert result.policy_version == 1  # two optimizer steps, one version
    m = result.metrics
    assert m["learner/optimizer_steps"] == 2.0
    assert {"critic/vf_loss", "critic/vf_clipfrac", "critic/values_mean", "critic/returns_mean"} <= m.keys()
    # Returns are the rewards (gamma = lam = 1): token-mean over 3 + 2 + 4 + 1 tokens = (3 + 2 + 0) / 10 = 0.5
    assert m["critic/returns_mean"] == pytest.approx(0.5, abs=1e-5)
    after = core.update.critic.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before), "the critic did not train"


@pytest.mark.parametrize("algorithm", [
    {"name": "grpo"}, {"name": "gspo"}, {"name": "dr_grpo"}, {"name": "reinforce_pp"},
    {"loss_agg": "seq-mean-token-sum", "clip_ratio_c": 3.0, "off_policy": "tis", "entropy_coef": 0.01},
])
def test_update_is_the_same_whatever_the_micro_batch_size(tiny_model_dir: Path, tmp_path: Path,
                                                          algorithm) -> None:
    # 16 tokens per micro-batch splits the 4 samples into 3-4 micro-batches; 4096 keeps them together.
    batch = TrainBatch(step=1, samples=samples(behaviour_shift=0.5))
    whole = learner(tiny_model_dir, tmp_path, **algorithm)
    split = learner(tiny_model_dir, tmp_path, micro_batch_tokens=16, **algorithm)
    m_whole, m_split = whole.train(batch).metrics, split.train(batch).metrics
    assert m_split["learner/micro_batches"] > m_whole["learner/micro_batches"] == 1.0
    # Gradients, not weights: Adam turns a near-zero gradient's rounding noise into a full-size step.
    for (name, p), (_, q) in zip(whole.model.named_parameters(), split.model.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-6, rtol=1e-4, msg=name)
    for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"):
        assert m_split[key] == pytest.approx(m_whole[key], abs=1e-5), key


def test_off_policy_metrics_measure_the_behaviour_gap(tiny_model_dir: Path, tmp_path: Path) -> None:
    # Behaviour log-probs -3 + 40 = 37 are far above any log-prob: pi_old / mu is tiny on every token,
    # so nothing exceeds the cap, and the gap |logp - mu| is large.
    core = learner(tiny_model_dir, tmp_path, off_policy="decoupled", is_cap=2.0)
    m = core.train(TrainBatch(step=1, samples=samples(behaviour_shift=40.0))).metrics
    assert m["rollout/logprob_diff_mean"] > 30.0
    assert m["actor/is_ratio_mean"] < 1e-6
    assert m["actor/is_clipfrac"] == 0.0


def test_kl_in_reward_reports_the_penalty(tiny_model_dir: Path, tmp_path: Path) -> None:
    core = learner(tiny_model_dir, tmp_path, name="reinforce_pp")
    m = core.train(TrainBatch(step=1, samples=samples())).metrics
    # The reference is the initial policy, so before the first update the KL (and the penalty) is 0.
    assert m["actor/reward_kl_penalty"] == pytest.approx(0.0, abs=1e-6)
    assert "actor/kl_loss" in m


def test_lora_trains_adapters_only_and_pushes_merged_weights(tiny_model_dir: Path, tmp_path: Path) -> None:
    core = learner(tiny_model_dir, tmp_path, lora=LoraConfig(rank=4, alpha=8.0), kl_coef=0.1)
    plain = learner(tiny_model_dir, tmp_path)
    assert [n for n, _ in core.named_weights()] == [n for n, _ in plain.named_weights()]
    trainable = [n for n, p in core.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    core.train(TrainBatch(step=1, samples=samples()))
    # The pushed weights equal peft's own merge of a copy; the base weights did not move.
    merged = dict(copy.deepcopy(core.model).merge_and_unload().named_parameters())
    pushed = dict(core.named_weights())
    base = dict(plain.named_weights())
    changed = 0
    # The pushed set is the model's weights (parameters and persistent buffers, see
    # rlfleet.weights.naming): no recomputed rotary buffers, nothing beyond peft's merge.
    buffers = {n for n, _ in plain.model.named_buffers()} & set(plain.model.state_dict())
    assert pushed.keys() - merged.keys() == buffers
    for name, tensor in pushed.items():
        if name not in merged:
            continue  # a buffer (rotary frequencies), pushed unchanged
        torch.testing.assert_close(tensor, merged[name], atol=1e-6, rtol=1e-6, msg=name)
        changed += not torch.equal(tensor, base[name])
    assert changed > 0
    q_proj = "model.layers.0.self_attn.q_proj.weight"
    base_name = f"base_model.model.{q_proj[:-len('.weight')]}.base_layer.weight"
    base_layer = dict(core.model.named_parameters())[base_name]
    torch.testing.assert_close(base_layer, base[q_proj], atol=0, rtol=0)


def test_a_cpu_learner_runs_the_cpu_micro_batch_default(tiny_model_dir: Path, tmp_path: Path) -> None:
    core = Learner(LearnerConfig(lr=1e-2), tiny_model_dir, CPU, torch.float32, tmp_path / "ckpt", seed=0,
                   algorithm=AlgorithmConfig(), max_response_tokens=4)
    assert core.update.micro_batch_tokens == 1024
