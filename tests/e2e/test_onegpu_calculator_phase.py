"""The "calculator N" phase of bench/onegpu_session.sh, run on CPU (ONEGPU_CPU=1) with the real
SmolLM2-135M (imported by `rlfleet model import`, as the setup phase does: the session's one import,
tests/e2e/conftest.py) and a few rows, so that the GPU session runs command lines already seen to work:
the hard task and tool-use traces written, the base model evaluated without and with the calculator,
`rlfleet sft` on the traces (2 steps of one trace: a step of two took ~12 s of forward and backward on
two loaded cores), the SFT model evaluated both ways, 1 GRPO step from the SFT model, the trained model
evaluated both ways, the table and the packed raw results."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.e2e.conftest import REPO, read_jsonl

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
SMALL = ["controller.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=24",
         "rollout.max_episode_tokens=96", "rollout.max_batch_sequences=8", "run.threads_per_service=1"]
ARMS = ("base, no tool", "base, with tool", "sft, no tool", "sft, with tool", "sft+grpo, no tool",
        "sft+grpo, with tool")


@pytest.mark.timeout(2400)  # SmolLM2 on two shared cores: six evaluations, 2 SFT steps, 1 GRPO step
def test_the_calculator_phase_runs_its_commands_on_cpu(smollm2: Path, tmp_path: Path) -> None:
    work, out = tmp_path / "work", tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "OUT": str(out), "RLFLEET_ONEGPU_WORK": str(work), "ONEGPU_CPU": "1",
           "ONEGPU_MODEL": str(smollm2), "PYTHON": sys.executable}
    phase = " ".join(["calculator 1", *SMALL])
    proc = subprocess.run(["bash", str(REPO / "bench" / "onegpu_session.sh"), phase], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=1800)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0, said[-3000:]
    assert "=== calculator took" in proc.stdout, said[-3000:]
    assert "rlfleet: wrote 16 traces (arithmetic, hard;" in proc.stdout, said[-3000:]
    assert "rlfleet: sft on 16 examples from hard-traces.parquet: 2 steps of 1" in proc.stdout, said[-3000:]
    for arm in ARMS:
        assert any(line.startswith(arm) for line in proc.stdout.splitlines()), said[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["calc-raw.tgz", "calculator-summary.json",
                                                     "calculator-table.txt"]  # few files come back
    summary = json.loads((out / "calculator-summary.json").read_text())
    assert list(summary["evals"]) == list(ARMS)
    assert [r["prompts"] for r in summary["evals"].values()] == [4] * 6
    assert summary["sft"]["steps"] == 2 and summary["sft"]["loss_first"] > 0
    assert summary["training"]["steps"] == 1 and summary["training"]["env_failed_total"] == 0
    with tarfile.open(out / "calc-raw.tgz") as archive:
        archive.extractall(tmp_path / "raw", filter="data")
    raw = tmp_path / "raw" / "calc-raw"
    tool_call = '<tool_call>{"name": "calculator", "arguments": {"expression": "..."}}</tool_call>'
    for name in ("base", "sft", "grpo"):  # the tool arm has the calculator in its prompts, the other none
        with_tool = read_jsonl(raw / f"calc-{name}-tool.samples.jsonl")
        without = read_jsonl(raw / f"calc-{name}-notool.samples.jsonl")
        assert all(tool_call in s["prompt"] for s in with_tool)
        assert not any("<tool_call>" in s["prompt"] for s in without)
    for arm in ARMS:
        turns = summary["evals"][arm]["turns_per_episode"]
        assert (turns >= 1.0) if arm.endswith("with tool") else turns is None
    trained = json.loads((raw / "calc-grpo-tool.json").read_text())
    assert "/outputs/calc-grpo/checkpoints/step_1" in trained["model"]
    assert json.loads((raw / "calc-sft-tool.json").read_text())["model"].endswith("calc-sft/model")
    metrics = read_jsonl(raw / "metrics-calc-grpo.jsonl")
    assert [m["step"] for m in metrics] == [1] and all(m["env/episodes"] == 4 for m in metrics)
    traces = read_jsonl(raw / "metrics-calc-sft.jsonl")
    assert [m["step"] for m in traces if "sft/loss" in m] == [1, 2]
