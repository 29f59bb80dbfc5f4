"""`rlfleet serve learner` with learner.world_size > 1, one process per rank under torchrun.

Rank 0 is the gRPC learner service (announced, health-checked, SIGTERM-aware like any other);
ranks > 0 serve nothing: they load their shard and then run whatever rank 0 announces
(``distributed.receive_command``) until it says stop. A rank that fails exits non-zero, and
torchrun then stops the whole world, so a broken learner is seen as a dead service.
"""
from __future__ import annotations

import structlog

from rlfleet.config import JobConfig
from services.learner.distributed import LearnerWorld, Op, init_learner_world, receive_batch, receive_command

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


def build_sharded_learner(cfg: JobConfig, world: LearnerWorld):
    from rlfleet.devices import resolve_dtype
    from rlfleet.models.resolve import resolve_model_path
    from services.learner.checkpoint import resolve_checkpoint
    from services.learner.fsdp import ShardedLearner

    learner = ShardedLearner(cfg.learner, resolve_model_path(cfg.model.path), world.device,
                             resolve_dtype(cfg.model.dtype, world.device), cfg.run.dir / "checkpoints",
                             seed=cfg.run.seed, algorithm=cfg.algorithm,
                             max_response_tokens=cfg.rollout.max_new_tokens)
    checkpoint = resolve_checkpoint(cfg.run.dir / "checkpoints", cfg.learner.resume_from)
    if checkpoint is not None:  # a resumed run, or a restart after a crash (learner.resume_from=auto)
        learner.restore(checkpoint)
        log.info("restored", checkpoint=str(checkpoint), policy_version=learner.version, rank=world.rank)
    return learner


def serve_sharded_learner(cfg: JobConfig, name: str = "learner") -> None:
    import torch
    import torch.distributed as dist

    from rlfleet.logging import setup_logging
    from rlfleet.proto.v1 import learner_pb2_grpc
    from rlfleet.rpc.service_main import run_service
    from services.learner.distributed import LearnerFront
    from services.learner.servicer import SERVICE_NAME, LearnerServicer

    # A collective waits for the slowest rank: a weight push waits for the rollouts, a train step
    # for the controller's batch; only a rank that died should make the others give up.
    world = init_learner_world(cfg.learner.world_size, cfg.learner.device, cfg.rollout.replicas,
                               timeout_s=max(1800.0, 4 * cfg.learner.weight_sync_timeout_s))
    if cfg.run.threads_per_service:  # the learner's share of the CPU cores, split between its ranks
        cfg.run.threads_per_service = max(1, cfg.run.threads_per_service // world.world_size)
    try:
        if world.rank != 0:
            setup_logging(f"{name}-rank{world.rank}", cfg.run.log_level,
                          cfg.run.dir / "logs" / f"{name}-rank{world.rank}.log", run=cfg.run.name)
            if cfg.run.threads_per_service:
                torch.set_num_threads(cfg.run.threads_per_service)
            learner = build_sharded_learner(cfg, world)
            log.info("following rank 0", rank=world.rank, world_size=world.world_size)
            follow(learner, world)
            return
        servicer = LearnerServicer(host=cfg.learner.host)
        front: list[LearnerFront] = []

        def load() -> None:
            front.append(LearnerFront(build_sharded_learner(cfg, world), world))
            servicer.attach(front[0])

        try:
            run_service("learner", cfg, cfg.learner, [SERVICE_NAME], learner_pb2_grpc.add_LearnerServicer_to_server,
                        servicer, load, name=name)
        finally:
            if front:
                front[0].stop()
    finally:
        dist.destroy_process_group()
