"""The rough edges of a first day (issue 43): what a new user meets on the CPU with the tiny model."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlfleet.cpu_threads import ENV, share_of_cores
from rlfleet.data.tasks import write_parquet
from tests.e2e.conftest import REPO, rlfleet

pytestmark = pytest.mark.e2e

# The digits task's rows carry their answer as the ground truth: the response column of an SFT.
SFT = ["--model", "builtin:tiny", "--response-key", "reward_model.ground_truth", "--batch-size", "4",
       "learner.device=cpu", "data.val_files=[]"]


def rlfleet_without_omp(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """The command as a user starts it: no OMP_NUM_THREADS (the suite's workers set one)."""
    env = {k: v for k, v in os.environ.items() if k != ENV}
    return subprocess.run([sys.executable, "-m", "rlfleet.app.cli", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_sft_on_the_cpu_computes_with_the_services_share_of_the_cores(tmp_path: Path) -> None:
    # torch's default (a thread per core, spinning) made an SFT step ~13x slower on a loaded 2-core
    # machine; the command takes what a service of `rlfleet run` takes: half the cores, at least one.
    train = write_parquet(tmp_path / "train.parquet", 8, seed=0, split="train")
    proc = rlfleet_without_omp("sft", "--data", str(train), "--output", str(tmp_path / "sft"), "--max-steps",
                               "1", *SFT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    threads = share_of_cores()
    assert f"1 steps of 4 on {threads} CPU thread" in proc.stdout, proc.stdout


@pytest.mark.parametrize("key, extra", [("data.train_files", []),
                                        ("data.val_files", ["controller.eval_every=5"])])
def test_a_missing_data_file_is_refused_before_the_earlier_run_is_moved_aside(tmp_path: Path, key: str,
                                                                              extra: list[str]) -> None:
    earlier = tmp_path / "outputs" / "default"
    earlier.mkdir(parents=True)
    (earlier / "metrics.jsonl").write_text('{"step": 1}\n')
    missing = tmp_path / "no-such.parquet"
    proc = rlfleet("run", f"run.output_dir={tmp_path / 'outputs'}", f"{key}=[{missing}]", *extra, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"{missing}" in proc.stderr and "does not exist" in proc.stderr, proc.stderr
    assert [p.name for p in (tmp_path / "outputs").iterdir()] == ["default"], proc.stdout
    assert (earlier / "metrics.jsonl").read_text() == '{"step": 1}\n'
