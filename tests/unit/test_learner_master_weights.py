"""A learner whose weights are bfloat16 keeps float32 master weights (and AdamW state in float32), so
updates smaller than bfloat16's resolution add up instead of rounding away.

Issue 45: the 12-step format warm start of the reasoning-gym recipe (lr 2e-5) taught SmolLM2-135M the
<answer> tags in float32 on the CPU and nothing in bfloat16 on the GPU. bfloat16 keeps 8 significant
bits: a weight in [2^-7, 2^-6) is a multiple of 2^-14 = 6.1e-5 apart from its neighbours, so AdamW's
first steps (each moves a weight by about lr) round back to the same value for every weight of
magnitude above ~lr * 2^9 (0.01 at lr 2e-5): measured on SmolLM2-135M, a step of 2e-5 changes 3.9 %
of its bfloat16 weights, a warm-up step of 1.8e-6 0.17 %.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlfleet.app.sft_trainer import SFT_ALGORITHM
from rlfleet.config import LearnerConfig
from rlfleet.types import TrainBatch, TrainSample
from services.learner.checkpoint import restore_learner
from services.learner.learner import Learner

pytestmark = pytest.mark.unit
CPU = torch.device("cpu")
LR = 1e-5
STEPS = 8


def sft_batch(step: int) -> TrainBatch:
    """The same two (prompt, response) pairs every step: the gradient keeps its sign, so AdamW moves
    each weight by about LR a step (m/sqrt(v) ~ +-1)."""
    rows = [([3, 4, 5], [6, 7, 8]), ([11, 12], [13, 14, 15])]
    return TrainBatch(step=step, samples=[
        TrainSample(prompt_ids=p, response_ids=r, behaviour_logprobs=[0.0] * len(r), advantage=1.0,
                    generation_version=step - 1) for p, r in rows], expected_version=step - 1)


def make(model_dir: Path, ckpt: Path, dtype: torch.dtype) -> Learner:
    return Learner(LearnerConfig(lr=LR, grad_clip=0.0), model_dir, CPU, dtype, ckpt, seed=0,
                   algorithm=SFT_ALGORITHM, max_response_tokens=4, total_steps=STEPS)


def weights(learner: Learner) -> dict[str, torch.Tensor]:
    return {n: p.detach().to(torch.float64).clone() for n, p in learner.model.named_parameters()}


def moved(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> float:
    return sum(float((after[n] - before[n]).abs().sum()) for n in before)


def train(learner: Learner, steps: range) -> None:
    for step in steps:
        learner.train(sft_batch(step))


def test_a_bfloat16_learner_moves_its_weights_as_far_as_a_float32_one(tiny_model_dir: Path, tmp_path: Path):
    f32 = make(tiny_model_dir, tmp_path / "f32", torch.float32)
    before32 = weights(f32)
    train(f32, range(1, STEPS + 1))
    bf16 = make(tiny_model_dir, tmp_path / "bf16", torch.bfloat16)
    before16 = weights(bf16)
    train(bf16, range(1, STEPS + 1))
    # Float32: about STEPS * LR = 8e-5 per weight. bfloat16 without master weights: only the weights
    # below ~LR * 2^9 = 0.005 in magnitude move at all (the tiny model's are N(0, 0.02)): a small
    # fraction of that. With master weights the 8e-5 accumulate in float32, and the bfloat16 copy shows
    # them to within half a unit in the last place.
    ratio = moved(before16, weights(bf16)) / moved(before32, weights(f32))
    assert 0.7 < ratio < 1.3, f"bfloat16 weights moved {ratio:.3f} x as far as float32 ones"


def test_master_weights_carry_updates_below_bfloat16_resolution():
    from services.learner.master_weights import MasterWeightAdamW

    # One bfloat16 weight at 1.0 with a constant gradient: AdamW's step is lr * m_hat / (sqrt(v_hat) + eps)
    # = lr * g / |g| = lr = 1e-3 exactly (eps 0), every step. Below 1.0 bfloat16's spacing is 2^-8 =
    # 0.00390625, so 1.0 - 1e-3 rounds back to 1.0: a plain bfloat16 AdamW never moves it.
    w = torch.nn.Parameter(torch.tensor([1.0], dtype=torch.bfloat16))
    opt = MasterWeightAdamW([w], lr=1e-3, eps=0.0, weight_decay=0.0)
    seen = []
    for _ in range(4):
        w.grad = torch.tensor([0.5], dtype=torch.bfloat16)
        opt.step()
        opt.zero_grad(set_to_none=True)
        seen.append(float(w.detach()))
    # The masters read 0.999, 0.998, 0.997, 0.996; halfway between 0.99609375 and 1.0 is 0.998046875:
    # 0.999 rounds to 1.0, the others to 0.99609375.
    assert seen == [1.0, 0.99609375, 0.99609375, 0.99609375]
    assert float(opt.param_groups[0]["params"][0]) == pytest.approx(0.996, abs=1e-7)
    plain = torch.nn.Parameter(torch.tensor([1.0], dtype=torch.bfloat16))
    plain_opt = torch.optim.AdamW([plain], lr=1e-3, eps=0.0, weight_decay=0.0)
    for _ in range(4):
        plain.grad = torch.tensor([0.5], dtype=torch.bfloat16)
        plain_opt.step()
    assert float(plain.detach()) == 1.0  # the failure master weights fix


def test_a_float32_learner_keeps_plain_adamw(tiny_model_dir: Path, tmp_path: Path):
    assert type(make(tiny_model_dir, tmp_path, torch.float32).optimizer) is torch.optim.AdamW


def test_a_resumed_bfloat16_learner_continues_from_its_master_weights(tiny_model_dir: Path, tmp_path: Path):
    straight = make(tiny_model_dir, tmp_path / "a", torch.bfloat16)
    train(straight, range(1, 5))
    first = make(tiny_model_dir, tmp_path / "b", torch.bfloat16)
    train(first, range(1, 3))
    path = first.save_checkpoint(2)
    resumed = make(tiny_model_dir, tmp_path / "b", torch.bfloat16)
    restore_learner(resumed, path)
    train(resumed, range(3, 5))
    # Restored from the bfloat16 weights alone, the masters would lose the 2 steps' sub-resolution
    # progress and the weights after step 4 would differ from the uninterrupted run's.
    for name, p in weights(straight).items():
        torch.testing.assert_close(weights(resumed)[name], p, rtol=0, atol=0, msg=name)


def test_a_checkpoint_of_plain_adamw_restores_into_master_weights(tiny_model_dir: Path, tmp_path: Path):
    from services.learner.master_weights import MasterWeightAdamW

    plain = Learner(LearnerConfig(lr=LR, grad_clip=0.0, master_weights=False), tiny_model_dir, CPU,
                    torch.bfloat16, tmp_path / "plain", seed=0, algorithm=SFT_ALGORITHM,
                    max_response_tokens=4, total_steps=STEPS)
    assert type(plain.optimizer) is torch.optim.AdamW
    train(plain, range(1, 3))
    path = plain.save_checkpoint(2)
    resumed = make(tiny_model_dir, tmp_path / "resumed", torch.bfloat16)
    assert isinstance(resumed.optimizer, MasterWeightAdamW)
    restore_learner(resumed, path)
    # no copies in that checkpoint: they are the restored bfloat16 weights, exactly
    for p, m in zip(resumed.optimizer.model_params, resumed.optimizer.masters()):
        assert m.dtype == torch.float32 and torch.equal(m, p.detach().float())
    train(resumed, range(3, 4))
    assert resumed.version == 3
