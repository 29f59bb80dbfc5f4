"""A learner sharded over 2 processes (FSDP2, gloo, torchrun) trains exactly like the 1-process learner:
same losses and metrics, same updated weights (float64, so only summation order differs;
also across a failed weight push and a restore from the sharded checkpoint;
tests/e2e/test_fsdp_learner.py trains a float32 one)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from services.learner.learner import Learner
from tests.unit.fsdp_worker import batch, build

pytestmark = [pytest.mark.service, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
STEPS = 2
# A KL term (the frozen reference is sharded too) and 2 mini-batches (2 optimizer steps per call).
ALGORITHM = {"name": "grpo", "kl_coef": 0.05, "mini_batches": 2, "loss_agg": "seq-mean-token-mean"}


def run_sharded(model_dir: Path, out: Path, device: str = "cpu") -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "tests.unit.fsdp_worker", str(model_dir), str(out), str(STEPS), json.dumps(ALGORITHM), device],
        check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((out / "metrics.json").read_text())


def test_two_process_learner_matches_one_process(tiny_model_dir: Path, tmp_path: Path) -> None:
    check_equivalence(tiny_model_dir, tmp_path, "cpu")


def check_equivalence(tiny_model_dir: Path, tmp_path: Path, device: str) -> None:
    """device: cpu (gloo) or auto (2 GPUs, NCCL; the one-process learner on GPU 0)."""
    sharded = run_sharded(tiny_model_dir, tmp_path / "sharded", device)
    single = build(Learner, tiny_model_dir, tmp_path / "single", ALGORITHM,
                   torch.device("cuda", 0) if device == "auto" else torch.device("cpu"))
    expected = [single.train(batch(step)).metrics for step in range(1, STEPS + 1)]
    weights_at_checkpoint = {k: v.detach().cpu().clone() for k, v in single.model.state_dict().items()}
    expected.append(single.train(batch(STEPS + 1)).metrics)  # the restored sharded learner's step

    assert sharded["version"] == single.version == STEPS + 1 and len(sharded["metrics"]) == STEPS + 1
    # and the steps after it still match
    assert sharded["push_error"], "the abandoned weight push did not fail"
    for step, (got, want) in enumerate(zip(sharded["metrics"], expected), start=1):
        # 3 per mini-batch: one more
        assert got["learner/micro_batches"] == want["learner/micro_batches"] == 6.0
        assert got["learner/optimizer_steps"] == 2.0  # than ranks, so rank 1 pads with a blank one
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm", "actor/pg_clipfrac",
                    "rollout/logprob_diff_mean", "actor/advantages_mean", "mismatch/kl",
                    "mismatch/abs_logprob_diff_max", "mismatch/ratio_over_2"):
            assert got[key] == pytest.approx(want[key], rel=1e-9, abs=1e-12), (step, key)
        assert got.keys() - {"timing/learner_step_s"} == want.keys() - {"timing/learner_step_s"}
    assert expected[1]["actor/kl_loss"] > 0  # the policy moved away from the reference

    # The checkpoint rank 0 wrote from the gathered shards holds the one-process learner's weights.
    weights = load_file(str(Path(sharded["checkpoint"]) / "model.safetensors"))
    initial = load_file(str(tiny_model_dir / "model.safetensors"))
    moved = 0
    for name, tensor in weights_at_checkpoint.items():
        if name not in weights:
            continue  # a non-persistent buffer
        torch.testing.assert_close(weights[name], tensor, atol=1e-10, rtol=1e-9, msg=name)
        moved += not torch.allclose(weights[name].float(), initial[name].float())
    assert moved > 10
    assert set(weights) == {n for n in single.model.state_dict() if n in initial}
    optim = torch.load(Path(sharded["checkpoint"]) / "optimizer.pt", weights_only=True)
    assert optim["state"], "the gathered optimizer state is empty"
