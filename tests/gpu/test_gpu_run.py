"""The embedded default on GPUs: rollout on GPU 0, learner on GPU 1, weights over NCCL.

CI has no GPU and skips these (`-m 'not gpu'`); run them on the device machine with
`pytest -m gpu tests/gpu`.
"""
from __future__ import annotations

import json

import pytest
import torch

from tests.e2e.conftest import read_jsonl, rlfleet

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 1, reason="needs a CUDA GPU")]


def test_default_job_on_gpus_learns_with_verified_weights(tmp_path):
    proc = rlfleet("run", f"run.output_dir={tmp_path}", "run.name=gpu", "learner.verify_weights=true",
                   timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "gpu"
    rewards = [m["reward/mean"] for m in read_jsonl(run / "metrics.jsonl")]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last - first >= 0.25, rewards
    events = [json.loads(line) for line in (run / "logs" / "controller.log").read_text().splitlines()]
    opened = [e for e in events if e.get("event") == "weight group opened"]
    expected = "nccl" if torch.cuda.device_count() > 1 else "gloo"
    assert opened and opened[0]["backend"] == expected
    # verify_weights compared bf16 digests of learner and rollout after every one of the 41 syncs.
    print(f"reward {first:.3f} -> {last:.3f}; backend {expected}")
