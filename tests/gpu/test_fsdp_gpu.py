"""The sharded learner on 2 GPUs (FSDP2 over NCCL) matches the one-GPU learner: the CPU test's
checks (tests/unit/test_fsdp_equivalence.py), run with torchrun on GPUs 0 and 1. CI skips it."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.unit.test_fsdp_equivalence import check_equivalence

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")]


def test_two_gpu_learner_matches_one_gpu(tiny_model_dir: Path, tmp_path: Path) -> None:
    check_equivalence(tiny_model_dir, tmp_path, "auto")
