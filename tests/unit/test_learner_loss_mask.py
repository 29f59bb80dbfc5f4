"""The learner trains only on the model's tokens of a multi-turn response: what sits at an observation
token (its behaviour logprob, the token itself) changes nothing, and the mask does."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlfleet.config import LearnerConfig
from rlfleet.types import TrainBatch, TrainSample
from services.learner.learner import Learner

pytestmark = pytest.mark.unit
CPU = torch.device("cpu")
PROMPT = [10, 11, 12]
RESPONSE = [13, 14, 20, 21, 22, 15, 16]
MASK = [1, 1, 0, 0, 0, 1, 1]  # turn 1 (2 tokens), an observation (3), turn 2 (2)


def train(model_dir: Path, tmp_path: Path, samples: list[TrainSample]) -> tuple[dict, dict]:
    core = Learner(LearnerConfig(lr=1e-2), model_dir, CPU, torch.float32, tmp_path / "ckpt", seed=0,
                   max_response_tokens=8)
    result = core.train(TrainBatch(step=1, samples=samples, expected_version=0))
    return result.metrics, {n: p.detach().clone() for n, p in core.model.named_parameters()}


def batch(observation_logprob: float, mask: list[int] | None = MASK) -> list[TrainSample]:
    response = RESPONSE
    logprobs = [-1.0, -2.0] + [observation_logprob] * 3 + [-1.5, -0.5]
    return [TrainSample(PROMPT, response, logprobs, advantage=1.0, generation_version=0, loss_mask=mask),
            TrainSample(PROMPT, response, logprobs, advantage=-1.0, generation_version=0, loss_mask=mask)]


def test_observation_tokens_do_not_reach_the_loss(tiny_model_dir: Path, tmp_path: Path):
    ref_metrics, ref_params = train(tiny_model_dir, tmp_path, batch(0.0))
    metrics, params = train(tiny_model_dir, tmp_path, batch(-50.0))  # garbage where the mask is 0
    for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "rollout/logprob_diff_mean"):
        assert metrics[key] == pytest.approx(ref_metrics[key], rel=1e-6, abs=1e-7), key
    for name, p in ref_params.items():
        torch.testing.assert_close(params[name], p, msg=name)


def test_the_mask_decides_what_is_trained(tiny_model_dir: Path, tmp_path: Path):
    masked, _ = train(tiny_model_dir, tmp_path, batch(-50.0))
    unmasked, _ = train(tiny_model_dir, tmp_path, batch(-50.0, mask=None))
    # Unmasked, the 3 observation tokens count too, with behaviour logprobs of -50: a different step.
    assert unmasked["rollout/logprob_diff_mean"] != pytest.approx(masked["rollout/logprob_diff_mean"])
    assert unmasked["actor/grad_norm"] != pytest.approx(masked["actor/grad_norm"])
