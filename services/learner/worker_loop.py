"""Ranks of a sharded learner (learner.world_size > 1, one process per rank under torchrun).

Rank 0 is the gRPC learner service (rlfleet.app.serve.serve_sharded_learner; announced,
health-checked, SIGTERM-aware like any other); ranks > 0 serve nothing: they load their shard and then run
whatever rank 0 announces (``distributed.receive_command``) until it says stop. A rank that fails exits
non-zero, and torchrun then stops the whole world, so a broken learner is seen as a dead service.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import structlog

from rlfleet.config import JobConfig
from services.learner.distributed import LearnerWorld, Op, receive_batch, receive_command

log = structlog.get_logger(__name__)


def follow(learner, world: LearnerWorld) -> None:
    """Ranks > 0: run rank 0's commands on this rank's shard until Stop."""
    while True:
        op, args = receive_command(world)
        if op == Op.STOP:
            return
        if op == Op.HEARTBEAT:
            continue
        if op == Op.TRAIN:
            learner.train(receive_batch(world, args))
        elif op == Op.PUSH:
            version, bucket_bytes, checksums, digest = args[:4]
            learner.follow_push(version, bucket_bytes, bool(checksums), bool(digest))
        elif op == Op.CHECKPOINT:
            learner.save_checkpoint(args[0])


def build_sharded_learner(cfg: JobConfig, world: LearnerWorld) -> tuple[Any, Path | None]:
    """This rank's ShardedLearner, and the checkpoint it was restored from (None: fresh)."""
    from rlfleet.devices import resolve_dtype
    from rlfleet.models.resolve import resolve_model_path
    from services.learner.checkpoint import resolve_checkpoint
    from services.learner.fsdp import ShardedLearner

    learner = ShardedLearner(cfg.learner, resolve_model_path(cfg.model.path), world.device,
                             resolve_dtype(cfg.model.dtype, world.device), cfg.run.dir / "checkpoints",
                             seed=cfg.run.seed, algorithm=cfg.algorithm,
                             max_response_tokens=cfg.rollout.max_new_tokens,
                             total_steps=cfg.controller.max_steps)
    checkpoint = resolve_checkpoint(cfg.run.dir / "checkpoints", cfg.learner.resume_from)
    if checkpoint is not None:  # a resumed run, or a restart after a crash (learner.resume_from=auto)
        learner.restore(checkpoint, verified=True)
        log.info("restored", checkpoint=str(checkpoint), policy_version=learner.version, rank=world.rank)
    return learner, checkpoint
