"""The learner's memory metrics exist only where they mean something: a CPU learner reports none
(no made-up zeros); tests/gpu/test_learner_memory_metrics.py checks them on a GPU."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlfleet.config import LearnerConfig
from rlfleet.types import TrainBatch
from services.learner.learner import Learner
from services.learner.memory_metrics import StepMemory
from tests.unit.test_learner_loss_mask import batch

pytestmark = pytest.mark.unit


def test_a_cpu_learner_reports_no_gpu_memory(tiny_model_dir: Path, tmp_path: Path):
    core = Learner(LearnerConfig(lr=1e-2), tiny_model_dir, torch.device("cpu"), torch.float32,
                   tmp_path / "ckpt", max_response_tokens=8)
    metrics = core.train(TrainBatch(step=1, samples=batch(0.0), expected_version=0)).metrics
    assert "actor/pg_loss" in metrics and not any(k.startswith("perf/learner_") for k in metrics)


def test_step_memory_counts_the_retries_of_this_step_only():
    stats = iter([{"num_alloc_retries": 7}, {"num_alloc_retries": 10,
                                             "allocated_bytes.all.peak": 3 * 2**30,
                                             "reserved_bytes.all.peak": 4 * 2**30}])
    memory = StepMemory.start(torch.device("cuda"), read_stats=lambda: next(stats), reset_peaks=lambda: None)
    assert memory.finish() == {"perf/learner_max_memory_allocated_gb": 3.0,
                               "perf/learner_max_memory_reserved_gb": 4.0, "perf/learner_alloc_retries": 3}
