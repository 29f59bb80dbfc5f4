"""`rlfleet run` with learner.world_size=2: the learner runs as 2 FSDP ranks under torchrun (gloo, CPU),
trains, and every version it pushes reaches the rollout bit for bit (learner.verify_weights)."""
from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import read_jsonl, rlfleet

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_sharded_learner_trains_and_syncs_weights(run_dir):
    steps = 3
    proc = rlfleet("run", f"run.output_dir={run_dir}", "run.name=fsdp", f"controller.max_steps={steps}",
                   "controller.max_staleness=0", "controller.prompts_per_step=4", "learner.world_size=2",
                   "learner.verify_weights=true", "algorithm.kl_coef=0.01", "learner.micro_batch_tokens=128",
                   timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "restart" not in proc.stderr, proc.stderr[-3000:]  # no learner rank died on the way
    out = run_dir / "fsdp"
    lines = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in lines] == list(range(1, steps + 1))
    assert [m["policy_version"] for m in lines] == list(range(steps))
    assert all(m["actor/kl_loss"] >= 0.0 for m in lines)
    assert all(m["learner/micro_batches"] >= 2 for m in lines)  # so both ranks trained on samples
    # verify_weights compared the digest of the learner's gathered shards with the rollout's weights
    # after each of the steps + 1 syncs; a mismatch would have stopped the run.
    events = [json.loads(line) for line in (out / "logs" / "controller.log").read_text().splitlines()]
    assert any(e.get("event") == "weight group opened" for e in events)
    # Both ranks ran: rank 0 served gRPC and wrote the checkpoint, rank 1 followed.
    assert (out / "logs" / "learner-rank1.log").stat().st_size > 0
    ckpt = out / "checkpoints" / f"step_{steps}"
    meta = json.loads((ckpt / "meta.json").read_text())
    assert meta["learner_world_size"] == 2 and (ckpt / "model.safetensors").is_file()
    samples = read_jsonl(out / "samples" / "train.jsonl")
    assert {s["version"] for s in samples} == set(range(steps))  # the rollout generated with every version


def test_sharded_learner_trains_from_the_data_plane(run_dir):
    """controller.data_plane=flight with 2 ranks: rank 0's servicer takes the batch's ids and log-probs from
    its staging store (or the replicas) before the batch goes to both ranks."""
    steps = 2
    proc = rlfleet("run", f"run.output_dir={run_dir}", "run.name=fsdp-flight",
                   f"controller.max_steps={steps}", "controller.max_staleness=0",
                   "controller.prompts_per_step=4", "learner.world_size=2", "controller.data_plane=flight",
                   "learner.micro_batch_tokens=128", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = run_dir / "fsdp-flight"
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == list(range(1, steps + 1))
    learner = [json.loads(line) for line in (out / "logs" / "learner.log").read_text().splitlines()]
    resolved = [e for e in learner if e.get("event") == "data plane resolved"]
    assert len(resolved) == steps and all(e["staged"] + e["fetched"] > 0 for e in resolved), resolved
