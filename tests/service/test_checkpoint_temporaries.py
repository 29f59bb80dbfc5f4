"""A learner killed while saving left `checkpoints/step_N.tmp-<pid>/` (a real model's weights and
optimizer) behind for good (issue 22). A starting learner removes those of processes that are
gone, and leaves its own and those of live processes alone.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rlfleet.config import LearnerConfig
from services.learner.checkpoint import remove_stale_temporaries
from tests.service.servicer_harness import make_learner

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _half_written(root, step: int, pid: int):
    tmp = root / f"step_{step}.tmp-{pid}"
    tmp.mkdir(parents=True)
    (tmp / "optimizer.pt").write_bytes(b"\0" * 1024)
    return tmp


def test_only_temporaries_of_dead_processes_are_removed(tmp_path):
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead = _half_written(tmp_path, 3, _dead_pid())
        ours = _half_written(tmp_path, 4, os.getpid())
        theirs = _half_written(tmp_path, 5, live.pid)
        odd = _half_written(tmp_path, 6, 0).rename(tmp_path / "step_6.tmp-notapid")
        complete = tmp_path / "step_2"
        complete.mkdir()
        assert remove_stale_temporaries(tmp_path) == [dead]
        assert not dead.exists()
        assert ours.exists() and theirs.exists() and odd.exists() and complete.exists()
    finally:
        live.kill()
        live.wait()


def test_a_starting_learner_cleans_its_checkpoint_folder(tiny_model_dir, tmp_path):
    stale = _half_written(tmp_path / "checkpoints", 7, _dead_pid())
    make_learner(tiny_model_dir, LearnerConfig(lr=1e-3), tmp_path / "checkpoints")
    assert not stale.exists()
