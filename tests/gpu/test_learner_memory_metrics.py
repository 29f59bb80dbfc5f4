"""A learner on a GPU reports its memory per step as verl does (peak allocated, peak reserved) and
the allocator's retries: each retry frees the whole cache and synchronises, the first suspect when a
learner sharing its GPU under a memory cap trains slower than alone."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlfleet.config import LearnerConfig
from rlfleet.types import TrainBatch
from services.learner.learner import Learner
from tests.unit.test_learner_loss_mask import batch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_a_gpu_learner_reports_peak_memory_allocator_retries_and_mfu(tiny_model_dir: Path, tmp_path: Path):
    core = Learner(LearnerConfig(lr=1e-2), tiny_model_dir, torch.device("cuda"), torch.bfloat16,
                   tmp_path / "ckpt", max_response_tokens=8)
    metrics = core.train(TrainBatch(step=1, samples=batch(0.0), expected_version=0)).metrics
    allocated = metrics["perf/learner_max_memory_allocated_gb"]
    reserved = metrics["perf/learner_max_memory_reserved_gb"]
    assert 0 < allocated <= reserved < torch.cuda.get_device_properties(0).total_memory / 2**30
    assert metrics["perf/learner_alloc_retries"] >= 0
    if torch.cuda.get_device_name(0).startswith("NVIDIA H"):  # a GPU whose peak flops.py knows
        assert 0 < metrics["perf/learner_mfu"] < 1
