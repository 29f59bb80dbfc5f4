"""The arithmetic recipe (deploy/configs/arithmetic-smollm2-135m.yaml, docs/recipes/arithmetic-smollm2.md)
shrunk to the CPU: its data commands, a few training steps of its config on the embedded tiny model
(model and devices overridden), the checkpoint's evaluation under the arithmetic rule, and the TRL arm
(bench/gsm8k_trl.py) on the same config and data with the same rule."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import read_jsonl, rlfleet

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "deploy" / "configs" / "arithmetic-smollm2-135m.yaml")


def make_data(folder: Path) -> tuple[Path, Path]:
    train, test = folder / "train.parquet", folder / "test.parquet"
    for path, rows, split in ((train, "16", "train"), (test, "4", "test")):
        proc = rlfleet("data", "arithmetic", "--output", str(path), "--rows", rows, "--split", split)
        assert proc.returncode == 0, proc.stderr
    return train, test


def test_arithmetic_recipe_config_runs_a_few_steps_on_the_tiny_model(tmp_path):
    train, test = make_data(tmp_path / "data")
    shrink = ["model.path=builtin:tiny", f"data.train_files=[{train}]", f"data.val_files=[{test}]",
              f"run.output_dir={tmp_path / 'runs'}", "rollout.n=2", "rollout.max_new_tokens=12",
              "controller.prompts_per_step=2", "controller.max_steps=2", "controller.eval_every=2",
              "learner.checkpoint_every=2", "learner.lr_warmup_steps=1",
              "rollout.device=cpu", "learner.device=cpu", "reward.device=cpu"]
    run = rlfleet("run", "--config", CONFIG, *shrink, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert "16 training prompts from train.parquet" in run.stdout
    run_dir = tmp_path / "runs" / "arithmetic-smollm2-135m"
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    train_lines = [m for m in metrics if "actor/pg_loss" in m]
    assert [m["step"] for m in train_lines] == [1, 2]
    assert train_lines[1]["actor/lr"] == pytest.approx(2e-5)  # the recipe's lr, after 1 warmup step
    assert [m["step"] for m in metrics if "val/rlfleet/arithmetic/accuracy" in m] == [0, 2]
    samples = read_jsonl(run_dir / "samples" / "train.jsonl")
    assert len(samples) == 2 * 2 * 2
    # scored by the arithmetic rule, which never credits a response cut at the 12-token budget
    assert all(s["reward"] == 0.0 for s in samples if s["finish_reason"] == "length")
    # the recipe's checkpoint evaluation: `rlfleet eval` on the run folder, the rule named
    report = tmp_path / "after.json"
    after = rlfleet("eval", "--config", CONFIG, *shrink, "--model", str(run_dir), "--output", str(report))
    assert after.returncode == 0, after.stderr[-3000:]
    result = json.loads(report.read_text())
    assert result["model"].endswith("step_2")
    assert result["by_source"]["rlfleet/arithmetic"]["rule"].startswith("arithmetic (")
    assert "arithmetic (after ####" in after.stdout


@pytest.mark.slow
def test_trl_arm_runs_the_recipe_config_with_the_same_rule(tmp_path):
    pytest.importorskip("trl")
    from rlfleet.models.tiny import ensure_tiny_model

    train, _ = make_data(tmp_path / "data")
    out = tmp_path / "trl"
    proc = subprocess.run(
        [sys.executable, "bench/gsm8k_trl.py", "--config", CONFIG, "--model", str(ensure_tiny_model()),
         "--data", str(train), "--out", str(out), "--max-steps", "1", "--micro-batch", "4",
         "controller.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=8"],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    first = json.loads(proc.stdout.splitlines()[0])
    assert first["rules"]["rlfleet/arithmetic"].startswith("arithmetic (")
    steps = read_jsonl(out / "trl_steps.jsonl")
    assert [s["step"] for s in steps] == [1] and steps[0]["samples"] == 4
    assert (out / "model" / "config.json").is_file()
