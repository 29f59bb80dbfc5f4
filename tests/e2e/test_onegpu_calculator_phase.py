"""The "calculator N" phase of bench/onegpu_session.sh, run on CPU with the real SmolLM2-135M (imported
by `rlfleet model import`, as the setup phase does: the session's one import, tests/e2e/conftest.py)
and a few generated arithmetic rows, so that the GPU session runs command lines already seen to work:
the base model evaluated without and with the calculator, 1 training step of the calculator recipe, the
trained model evaluated both ways, the table and the copied outputs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import REPO, read_jsonl, rlfleet

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
SMALL = ["controller.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=24",
         "rollout.max_episode_tokens=96", "rollout.max_batch_sequences=8", "run.threads_per_service=1"]


def test_the_calculator_phase_runs_its_commands_on_cpu(smollm2: Path, tmp_path: Path) -> None:
    work, out = tmp_path / "work", tmp_path / "out"
    out.mkdir()
    (work / "models").mkdir(parents=True)
    (work / "models" / "smollm2-135m").symlink_to(smollm2)  # where the setup phase imports it
    for split, rows in (("train", "32"), ("test", "4")):
        proc = rlfleet("data", "arithmetic", "--output", str(work / "data" / f"{split}.parquet"),
                       "--rows", rows, "--split", split)
        assert proc.returncode == 0, proc.stderr[-3000:]
    env = {**os.environ, "OUT": str(out), "RLFLEET_ONEGPU_WORK": str(work),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}  # python3: this one
    phase = " ".join(["calculator 1", *SMALL])
    proc = subprocess.run(["bash", str(REPO / "bench" / "onegpu_session.sh"), phase], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "=== calculator took" in proc.stdout, proc.stdout[-3000:]
    assert "rlfleet: the environment's tools in every prompt: calculator (as a system message)" in proc.stdout
    for arm in ("base, no tool", "base, with tool", "trained, no tool", "trained, with tool"):
        assert any(line.startswith(arm) for line in proc.stdout.splitlines()), proc.stdout[-3000:]
    summary = json.loads((out / "calculator-summary.json").read_text())
    assert summary["training"]["steps"] == 1 and summary["training"]["env_failed_total"] == 0
    assert [r["prompts"] for r in summary["evals"].values()] == [4, 4, 4, 4]
    tool_call = '<tool_call>{"name": "calculator", "arguments": {"expression": "..."}}</tool_call>'
    for name in ("base", "trained"):  # the tool arm has the calculator in its prompts, the other none
        with_tool = read_jsonl(out / f"calc-{name}-tool.samples.jsonl")
        without = read_jsonl(out / f"calc-{name}-notool.samples.jsonl")
        assert all(tool_call in s["prompt"] for s in with_tool)
        assert not any("<tool_call>" in s["prompt"] for s in without)
        assert summary["evals"][f"{name}, with tool"]["turns_per_episode"] >= 1.0
        assert summary["evals"][f"{name}, no tool"]["turns_per_episode"] is None
    trained = json.loads((out / "calc-trained-tool.json").read_text())
    assert "/outputs/calc-1/checkpoints/step_1" in trained["model"]
    metrics = read_jsonl(out / "metrics-calc-1.jsonl")
    assert [m["step"] for m in metrics] == [1] and all(m["env/episodes"] == 4 for m in metrics)
