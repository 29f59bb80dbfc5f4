"""The reward model on a GPU of its own: same scores as on the CPU, batched, in bfloat16 and float32.

CI has no GPU and skips this; run it on the device machine with `pytest -m gpu tests/gpu`.
"""
from __future__ import annotations

import pytest
import torch

from rlfleet.config import load_config
from services.reward.build import build_scorer
from services.reward.rm import RewardModel
from tests.service.test_reward_model import ITEMS, build_rm

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_reward_model_on_its_own_gpu_matches_the_cpu(tmp_path, tiny_tokenizer):
    path = build_rm(tmp_path / "rm", tiny_tokenizer)
    cpu = [r.score for r in RewardModel(path, torch.device("cpu"), torch.float32).score(ITEMS)]
    last = torch.cuda.device_count() - 1
    cfg = load_config(None, [f"reward.model.path={path}", f"reward.model.device=cuda:{last}",
                             "reward.model.dtype=float32", "reward.model.batch_size=2"])
    gpu = build_scorer(cfg.reward)
    assert gpu.device == torch.device("cuda", last)
    assert next(gpu.model.parameters()).device == torch.device("cuda", last)
    assert [r.score for r in gpu.score(ITEMS)] == pytest.approx(cpu, abs=1e-4)
    bf16 = RewardModel(path, torch.device("cuda", last), torch.bfloat16, batch_size=4).score(ITEMS)
    assert all(r.ok for r in bf16)
    assert [r.score for r in bf16] == pytest.approx(cpu, abs=0.05)
    auto = build_scorer(load_config(None, [f"reward.model.path={path}"]).reward)
    assert auto.device.type == "cuda" and auto.device.index == 2 % torch.cuda.device_count()
