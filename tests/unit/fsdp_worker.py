"""One rank of a 2-process sharded learner, for tests/unit/test_fsdp_equivalence.py (run by torchrun).

Rank 0 drives the world through LearnerFront exactly as the gRPC servicer does (each command is
announced to rank 1, which runs worker_loop.follow): a train step, a weight push that a rollout
abandons half-way, `steps - 1` more train steps, a checkpoint; then a fresh sharded learner
restored from it trains step `steps + 1`. Rank 0 writes the metrics of each step to OUT/metrics.json.
Usage: torchrun --nproc-per-node 2 -m tests.unit.fsdp_worker MODEL_DIR OUT_DIR STEPS ALGORITHM_JSON [DEVICE]
(DEVICE: cpu, the default, trains over gloo; auto takes GPU LOCAL_RANK and NCCL)
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from rlfleet.algorithm import AlgorithmConfig
from rlfleet.config import LearnerConfig
from rlfleet.types import TrainBatch, TrainSample

LR = 1e-2
MICRO_BATCH_TOKENS = 10  # 3 micro-batches per mini-batch: 2 on rank 0, 1 (+ a blank one) on rank 1


def batch(step: int) -> TrainBatch:
    """Three groups of two: prompts and responses of different lengths, rewards and advantages ±."""
    rows = [([3, 4, 5], [6, 7, 8], 1.0, 1.0), ([3, 4, 5], [9, 10], 0.0, -1.0),
            ([11, 12], [13, 14, 15, 16], 0.5, 1.0), ([11, 12], [17], 0.0, -1.0),
            ([20, 21, 22, 23], [24, 25], 1.0, 0.7), ([20, 21, 22, 23], [26, 27, 28], 0.2, -0.7)]
    # Multi-turn responses with observation tokens masked out of the loss, on both ranks' micro-batches
    # (rank 1 trains the 2nd and the 5th: the masks must reach it through send_batch/receive_batch).
    masks = [[1, 0, 1], [1, 0], [1, 0, 0, 1], None, [0, 1], [1, 0, 1]]
    samples = [TrainSample(prompt_ids=p, response_ids=r,
                           behaviour_logprobs=[-3.0 - 0.1 * j for j in range(len(r))],
                           advantage=a, generation_version=step - 1, reward=rew, loss_mask=mask)
               for (p, r, rew, a), mask in zip(rows, masks)]
    return TrainBatch(step=step, samples=samples, temperature=0.9, expected_version=step - 1)


def build(learner_cls, model_dir: Path, out: Path, algorithm: dict, device: torch.device | None = None):
    device = device or torch.device("cpu")
    # gloo weight group: the test's rollout is a thread of rank 0, which on GPUs shares its GPU
    cfg = LearnerConfig(lr=LR, micro_batch_tokens=MICRO_BATCH_TOKENS, weight_backend="gloo")
    return learner_cls(cfg, model_dir, device, torch.float64, out / "ckpt", seed=0,
                       algorithm=AlgorithmConfig(**algorithm), max_response_tokens=4)


def failed_push(front, learner) -> str:
    """A weight push whose one rollout leaves after the manifest: rank 0's sender fails part-way
    (small buckets, so gathers remain) and must finish the gathers rank 1 is waiting in."""
    import threading

    from rlfleet.errors import WeightSyncError
    from rlfleet.weights import WeightGroup
    from rlfleet.weights.manifest import HEADER_WORDS

    address, _ = front.open_weight_group(2, "127.0.0.1", 5.0)
    learner.weight_groups.find(address).sender.bucket_bytes = 16 << 10  # ~45 buckets instead of one

    def rollout_that_leaves() -> None:
        group = WeightGroup.join(address, 1, 2, "gloo", timeout_s=5.0)
        group.connect()
        header = torch.zeros(HEADER_WORDS, dtype=torch.int64)  # rlfleet.weights.manifest's push header
        group.broadcast(header)
        group.broadcast(torch.empty(int(header[2]), dtype=torch.uint8))  # the layout (a first push sends it)
        group.close()

    thread = threading.Thread(target=rollout_that_leaves)
    thread.start()
    try:
        front.push_weights(learner.version, digest=True)
    except WeightSyncError as exc:
        return str(exc) or type(exc).__name__
    finally:
        thread.join()
    return ""


def main() -> None:
    model_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    steps, algorithm = int(sys.argv[3]), json.loads(sys.argv[4])
    torch.set_num_threads(1)
    from services.learner.distributed import LearnerFront, exit_learner_world, init_learner_world
    from services.learner.fsdp import ShardedLearner
    from services.learner.worker_loop import follow

    world = init_learner_world(2, sys.argv[5] if len(sys.argv) > 5 else "cpu", 0, timeout_s=120)
    learner = build(ShardedLearner, model_dir, out, algorithm, world.device)
    if world.rank != 0:
        follow(learner, world)
        restored = build(ShardedLearner, model_dir, out, algorithm, world.device)
        restored.restore(out / "ckpt" / f"step_{steps}")
        follow(restored, world)
    else:
        front = LearnerFront(learner, world, heartbeat_s=0.01)  # heartbeats between the commands too
        metrics = [front.train(batch(1)).metrics]
        push_error = failed_push(front, learner)  # the ranks must still be in step after it
        metrics += [front.train(batch(step)).metrics for step in range(2, steps + 1)]
        path = front.save_checkpoint(steps)
        front.stop()
        # A fresh sharded learner resumed from that checkpoint trains one more step.
        restored = build(ShardedLearner, model_dir, out, algorithm, world.device)
        restored.restore(path)
        front = LearnerFront(restored, world, heartbeat_s=0.01)
        metrics.append(front.train(batch(steps + 1)).metrics)
        front.stop()
        (out / "metrics.json").write_text(json.dumps({"metrics": metrics, "checkpoint": str(path),
                                                      "version": restored.version, "push_error": push_error}))
    exit_learner_world(0)  # as the service does: the interpreter's teardown can abort after FSDP2 on gloo


if __name__ == "__main__":
    main()
