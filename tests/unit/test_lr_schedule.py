"""The learning-rate schedule (services/learner/schedule.py), numbers derived by hand."""
from __future__ import annotations

import math

import pytest
import torch

from services.learner.schedule import build_lr_scheduler, lr_factor, warmup_steps

pytestmark = pytest.mark.unit


def test_warmup_steps_explicit_wins_else_ratio_rounded_up():
    assert warmup_steps(100, 5, 0.5) == 5
    assert warmup_steps(100, 0, 0.03) == 3  # 0.03 * 100 = 3
    assert warmup_steps(10, 0, 0.25) == 3  # 2.5 rounds up
    assert warmup_steps(10, 0, 0.0) == 0


def test_warmup_is_linear_and_never_zero():
    # warmup 3: factors 1/4, 2/4, 3/4, then the schedule proper.
    f = [lr_factor(s, kind="constant", total_steps=10, warmup=3, min_lr_ratio=0.0) for s in range(5)]
    assert f == [0.25, 0.5, 0.75, 1.0, 1.0]


def test_linear_decay_to_floor():
    # total 10, warmup 0, floor 0.1: step s has progress s/10, factor 0.1 + 0.9 * (1 - s/10).
    f = [lr_factor(s, kind="linear", total_steps=10, warmup=0, min_lr_ratio=0.1) for s in (0, 5, 10, 20)]
    assert f == pytest.approx([1.0, 0.55, 0.1, 0.1])


def test_cosine_decay_halfway_is_half():
    # warmup 2 of 12: decay over 10 steps; step 7 is halfway, cos(pi/2) = 0, factor 0.5.
    assert lr_factor(7, kind="cosine", total_steps=12, warmup=2, min_lr_ratio=0.0) == pytest.approx(0.5)
    assert lr_factor(2, kind="cosine", total_steps=12, warmup=2, min_lr_ratio=0.0) == pytest.approx(1.0)
    assert lr_factor(12, kind="cosine", total_steps=12, warmup=2,
                     min_lr_ratio=0.0) == pytest.approx(0.0, abs=1e-12)
    # quarter of the way: 0.5 * (1 + cos(pi/4)) = 0.8536
    assert lr_factor(4.5, kind="cosine", total_steps=12, warmup=2, min_lr_ratio=0.0) == pytest.approx(
        0.5 * (1 + math.cos(math.pi / 4)))


def test_scheduler_drives_the_optimizer_lr():
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([param], lr=1e-3)
    sched = build_lr_scheduler(opt, kind="linear", total_steps=4, warmup_steps_=1, min_lr_ratio=0.0)
    seen = []
    for _ in range(5):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    # step 0: warmup 1/2; then decay over 3 steps: 1, 2/3, 1/3, 0.
    assert seen == pytest.approx([5e-4, 1e-3, 2e-3 / 3, 1e-3 / 3, 0.0])
