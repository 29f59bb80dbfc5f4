"""bench/onegpu_session.sh's issue-21 phases, their command lines run on the CPU (ONEGPU_CPU=1: the tiny
model, a few rows, 2 samples of 8 tokens): parity (rlfleet S=0 and TRL, two seeds each, all at once, TRL
checkpoints evaluated as written), staleness (S=1, S=2) merged with it, gsm8k-eval and sft-gsm8k, each
leaving its tables in $OUT within the 8 files a device call brings back. Only the GPU is left untested."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def session(tmp_path: Path, out: Path, *phases: str) -> str:
    out.mkdir()
    env = {**os.environ, "OUT": str(out), "ONEGPU_CPU": "1", "ONEGPU_WORK": str(tmp_path / "work"),
           "PYTHON": sys.executable}
    proc = subprocess.run(["bash", "bench/onegpu_session.sh", *phases], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_parity_staleness_and_gsm8k_phases_on_the_cpu(tmp_path):
    pytest.importorskip("trl")
    first = session(tmp_path, tmp_path / "out1", "setup", "parity 2 2 1")
    assert "rlfleet-S0-seed2: rc=0, 64 training prompts from train.parquet, 3 evaluations, 2 steps" in first
    assert "trl-seed1: rc=0, 2 steps, evaluated step_1 step_2" in first
    assert sorted(p.name for p in (tmp_path / "out1").iterdir()) == [
        "parity-raw.tgz", "parity.json", "parity.md"]
    parity = json.loads((tmp_path / "out1" / "parity.json").read_text())
    assert {arm: sorted(steps) for arm, steps in parity["summary"].items()} == {
        "trl": ["0", "1", "2"], "rlfleet-S0": ["0", "1", "2"]}
    assert all(cell["n"] == 2 for steps in parity["summary"].values() for cell in steps.values())

    second = session(tmp_path, tmp_path / "out2", "staleness 1 1 1", "gsm8k-eval", "sft-gsm8k 1")
    staleness = json.loads((tmp_path / "out2" / "staleness.json").read_text())
    assert list(staleness["summary"]) == ["trl", "rlfleet-S0", "rlfleet-S1", "rlfleet-S2"]  # merged
    assert sorted(staleness["summary"]["rlfleet-S2"]) == ["0", "1"]
    assert "| base | 4 |" in second and "`gsm8k_flexible`" in second
    sft = json.loads((tmp_path / "out2" / "sft-gsm8k.json").read_text())
    assert [row["label"] for row in sft] == ["base", "sft-1ep", "sft-grpo-1"]
    assert sft[0]["by_fn"]["gsm8k"]["rules"]["openai/gsm8k"].startswith("gsm8k (verl strict")
    assert len(list((tmp_path / "out2").iterdir())) <= 8


def test_reasoning_gym_phases_on_the_cpu(tmp_path):
    """reasoning-gym-base (which tasks the base model starts on) and reasoning-gym N TASK (data, base
    evaluation, N steps, evaluation of the trained model): issue 33's recipe, its command lines on the CPU.
    The run phase names a model (model=NAME: $work/models/NAME on the GPU, the tiny model here), so its files
    carry NAME; the base table shows each task's majority-answer baseline (issue 45)."""
    pytest.importorskip("reasoning_gym")
    out = tmp_path / "out"
    stdout = session(tmp_path, out, "reasoning-gym-base chain_sum,leg_counting",
                     "reasoning-gym 2 chain_sum model=qwen2.5-coder-0.5b")
    assert "=== reasoning-gym took" in stdout and "rlfleet: error" not in stdout, stdout[-3000:]
    assert "wrote 64 train rows (chain_sum)" in stdout and "wrote 8 test rows (chain_sum)" in stdout
    base = json.loads((out / "rg-base.json").read_text())
    assert set(base["by_source"]) <= {"reasoning_gym/chain_sum", "reasoning_gym/leg_counting"}
    assert "reasoning_gym/chain_sum" in base["by_source"]  # leg_counting's may be too long for the tiny model
    assert base["by_source"]["reasoning_gym/chain_sum"]["majority_baseline"] is not None
    assert " baseline " in stdout  # the eval table's column, printed by the base phase
    for report in ("rg-qwen2.5-coder-0.5b-chain_sum-base.json",
                   "rg-qwen2.5-coder-0.5b-chain_sum-trained.json"):
        by_source = json.loads((out / report).read_text())["by_source"]
        assert by_source["reasoning_gym/chain_sum"]["prompts"] == 8
        assert by_source["reasoning_gym/chain_sum"]["rule"] == "reasoning_gym"
    metrics = [json.loads(line)
               for line in (out / "metrics-rg-qwen2.5-coder-0.5b-chain_sum-2.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert "val/reasoning_gym/chain_sum/accuracy" in metrics[-1]  # the run evaluated at its last step
    assert len(list(out.iterdir())) <= 8  # what one device call brings back



@pytest.mark.parametrize("flags, arm", [("noeval", "trl"), ("fast noeval", "trl-fast"),
                                       ("noeval fast", "trl-fast")])
def test_trl_phase_noeval_names_no_arm_and_skips_the_evaluation(tmp_path, flags, arm):
    """`trl N noeval` named its arm trl-noeval and still evaluated (only a 4th word was read as noeval).
    Where TRL is absent the phase's TRL run fails at once; what it announces, and that it does not go on
    to `rlfleet eval` (of the model it would have written), is checked either way."""
    stdout = session(tmp_path, tmp_path / "out", f"trl 1 {flags}")
    assert f"trl: arm {arm}, no evaluation (noeval)" in stdout, stdout[-3000:]
    assert "trl-noeval" not in stdout and "rlfleet: error: --model" not in stdout, stdout[-3000:]
