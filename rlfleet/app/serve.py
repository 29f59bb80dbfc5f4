"""`rlfleet serve ROLE`: builds one service's core and runs it.

Each service's TLS, bearer token and request limits come from its job config (`security`,
`limits`) and are handed to its server, servicer and channels here: nothing is process-wide."""
from __future__ import annotations

import os

import structlog

from rlfleet.config import JobConfig, LearnerConfig
from rlfleet.app.gpu_plan import plan_learner, plan_rollout
from rlfleet.rpc.security import Security
from rlfleet.rpc.service_main import run_service

ROLES = ("rollout", "reward", "learner")


def serve_rollout(cfg: JobConfig, name: str = "rollout", index: int = 0, join: str | None = None,
                  advertise: str | None = None) -> None:
    """`join`: the controller (HOST:PORT) of a running job whose fleet this replica joins once it
    serves (rlfleet/app/fleet_member.py); `advertise`: the address the controller reaches it at."""
    from rlfleet.extensions import ROLLOUT_ENGINES
    from rlfleet.models.resolve import resolve_model_path
    from rlfleet.proto.v1 import rollout_pb2_grpc
    from services.rollout.agent_loop import build_agent
    from services.rollout.servicer import SERVICE_NAME, RolloutServicer

    security = Security.from_config(cfg.security, cfg.limits)
    servicer = RolloutServicer(limits=cfg.limits, weight_token=security.token)
    payload_server = None
    if cfg.controller.data_plane == "flight":  # this replica holds its groups' tokens for the learner
        from rlfleet.dataplane.flight import PayloadClient, PayloadServer
        from rlfleet.dataplane.push import PayloadPusher
        from rlfleet.dataplane.store import MemoryStore

        payload_server = PayloadServer(MemoryStore(), cfg.rollout.host, 0, security)
        address = data_plane_address(cfg.rollout.host, payload_server.port, advertise, join)
        servicer.payloads = (payload_server.store, address)
        servicer.pusher = PayloadPusher(payload_server.store, address,  # to the learner's staging store
                                        PayloadClient(security, timeout_s=cfg.controller.rpc_timeout_s))

    def load() -> None:
        from rlfleet.devices import keep_triton_out, resolve_device, resolve_dtype

        device = resolve_device(cfg.rollout.device, prefer_index=index)  # replica i takes GPU i
        if cfg.rollout.backend == "hf":  # vLLM probes for Triton with find_spec, which a hidden module fails
            keep_triton_out(device)
        path, dtype = resolve_model_path(cfg.model.path), resolve_dtype(cfg.model.dtype, device)
        rollout_cfg = plan_rollout(cfg, device, path, dtype)  # its share of a GPU shared with the learner
        engine = ROLLOUT_ENGINES.get(cfg.rollout.backend)(path, device, dtype, rollout_cfg, cfg.run.seed)
        # the environment server is reached with the job's TLS and token, as the other services are
        agent = build_agent(engine, rollout_cfg, cfg.env, security) if cfg.env.enabled else None
        servicer.attach(engine, agent)

    on_serving = None
    if join:
        from rlfleet.app.fleet_member import join_when_serving
        on_serving = join_when_serving(join, security, name, resolve_model_path(cfg.model.path),
                                       cfg.controller.service_wait_s, advertise, cfg.run.dir)
    try:
        run_service("rollout", cfg, cfg.rollout, [SERVICE_NAME],
                    rollout_pb2_grpc.add_RolloutServicer_to_server, servicer, load, name=name,
                    security=security, on_serving=on_serving)
    finally:
        if payload_server is not None:
            servicer.pusher.close()
            payload_server.shutdown()


def data_plane_address(bound_host: str, port: int, advertise: str | None, towards: str | None) -> str:
    """Where the learner reaches a replica's data plane: --advertise's host (its port is the gRPC
    server's), else as the replica's own gRPC address (a wildcard bind: the interface towards `towards`)."""
    from rlfleet.app.fleet_member import advertised_address

    host = advertise.rsplit(":", 1)[0] if advertise and ":" in advertise.rsplit("]", 1)[-1] else advertise
    return f"{host}:{port}" if host else advertised_address(f"{bound_host}:{port}", None, towards=towards)


def serve_reward(cfg: JobConfig, name: str = "reward", index: int = 0) -> None:
    from rlfleet.proto.v1 import reward_pb2_grpc
    from services.reward.build import build_scorer
    from services.reward.servicer import SERVICE_NAME, RewardServicer

    security = Security.from_config(cfg.security, cfg.limits)  # also that of its channels to reward sources
    servicer = RewardServicer(limits=cfg.limits)

    def load() -> None:
        servicer.attach(build_scorer(cfg.reward, cfg.controller.connect_timeout_s, security))

    run_service("reward", cfg, cfg.reward, [SERVICE_NAME], reward_pb2_grpc.add_RewardServicer_to_server,
                servicer, load, name=name, security=security, uses_torch=bool(cfg.reward.model.path))


def serve_learner(cfg: JobConfig, name: str = "learner", index: int = 0) -> None:
    if cfg.learner.world_size > 1:  # one process per rank under torchrun; rank 0 serves gRPC
        return serve_sharded_learner(cfg, name)
    from rlfleet.models.resolve import resolve_model_path
    from rlfleet.proto.v1 import learner_pb2_grpc
    from rlfleet.checkpoint_files import VERDICTS_ENV, DigestChecks
    from services.learner.checkpoint import resolve_checkpoint, restore_learner
    from services.learner.servicer import SERVICE_NAME, LearnerServicer

    security = Security.from_config(cfg.security, cfg.limits)
    servicer = LearnerServicer(host=cfg.learner.host, limits=cfg.limits, weight_token=security.token)
    staging_server = attach_data_plane(cfg, servicer, security)

    def load() -> None:
        # The checks `rlfleet run` made just before starting this learner are not made again.
        checks = DigestChecks()
        checks.adopt(os.environ.get(VERDICTS_ENV, "[]"))
        # First, so a damaged or missing checkpoint is reported before a model load of minutes.
        checkpoint = resolve_checkpoint(cfg.run.dir / "checkpoints", cfg.learner.resume_from, checks)
        from rlfleet.devices import keep_triton_out, resolve_device, resolve_dtype

        # The learner takes the GPU after the rollout replicas' (they take 0 .. replicas-1).
        device = resolve_device(cfg.learner.device, prefer_index=cfg.rollout.replicas)
        keep_triton_out(device)  # before transformers' models are imported (services.learner.learner)
        import torch

        from services.learner.learner import Learner

        gpus = torch.cuda.device_count() if device.type == "cuda" else 0
        learner_cfg, path = learner_runtime_config(cfg, device, gpus), resolve_model_path(cfg.model.path)
        dtype = resolve_dtype(cfg.model.dtype, device)
        # its share of a GPU shared with a rollout, and its micro-batch when unset
        learner_cfg = plan_learner(cfg, learner_cfg, device, path, dtype)
        learner = Learner(learner_cfg, path, device, dtype, cfg.run.dir / "checkpoints",
                          seed=cfg.run.seed, algorithm=cfg.algorithm,
                          max_response_tokens=cfg.rollout.max_new_tokens,
                          total_steps=cfg.controller.max_steps)
        if checkpoint is not None:  # a resumed run, or a restart after a crash (learner.resume_from=auto)
            restore_learner(learner, checkpoint, verified=True)
        servicer.attach(learner, restored_from=checkpoint, digest_checks=checks)

    try:
        run_service("learner", cfg, cfg.learner, [SERVICE_NAME],
                    learner_pb2_grpc.add_LearnerServicer_to_server, servicer, load, name=name,
                    security=security)
    finally:
        if staging_server is not None:
            staging_server.shutdown()


def attach_data_plane(cfg: JobConfig, servicer, security: Security):
    """controller.data_plane=flight: the servicer takes the batch's ids and log-probs from its staging
    store or fetches them from the replicas (before a sharded learner broadcasts the batch to its ranks).
    Returns the staging store's server, to shut down with the service (None: none)."""
    if cfg.controller.data_plane != "flight":
        return None
    from rlfleet.dataplane.flight import PayloadClient

    servicer.payloads = PayloadClient(security, timeout_s=cfg.controller.rpc_timeout_s)
    if not cfg.learner.staging_max_tokens:
        return None
    staging_server, servicer.payload_sink = serve_staging(cfg, security)
    servicer.staging = staging_server.store
    return staging_server


def serve_staging(cfg: JobConfig, security: Security):
    """The learner's staging store on a Flight server of its own (rlfleet/dataplane/staging.py), at the
    learner's host and a free port, and where the replicas reach it (GetStatus.payload_sink)."""
    from rlfleet.dataplane.flight import PayloadServer
    from rlfleet.dataplane.staging import StagingStore

    # a group staged max_staleness + 1 versions ago can be trained no more (staging.StagingStore); one more
    # version of margin
    store = StagingStore(cfg.learner.staging_max_tokens, max_age=cfg.controller.max_staleness + 2)
    server = PayloadServer(store, cfg.learner.host, 0, security)
    return server, data_plane_address(cfg.learner.host, server.port, None, None)


def serve_sharded_learner(cfg: JobConfig, name: str = "learner") -> None:
    import torch
    import torch.distributed as dist

    from rlfleet.logging import setup_logging
    from rlfleet.proto.v1 import learner_pb2_grpc
    from rlfleet.rpc.service_main import run_service
    from services.learner.distributed import LearnerFront, exit_learner_world, init_learner_world
    from services.learner.servicer import SERVICE_NAME, LearnerServicer
    from services.learner.worker_loop import build_sharded_learner, follow

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
            learner, _ = build_sharded_learner(cfg, world)
            structlog.get_logger(__name__).info("following rank 0", rank=world.rank,
                                                world_size=world.world_size)
            follow(learner, world)
        else:
            security = Security.from_config(cfg.security, cfg.limits)
            servicer = LearnerServicer(host=cfg.learner.host, limits=cfg.limits, weight_token=security.token)
            staging_server = attach_data_plane(cfg, servicer, security)
            front: list[LearnerFront] = []

            def load() -> None:
                learner, restored_from = build_sharded_learner(cfg, world)
                front.append(LearnerFront(learner, world))
                servicer.attach(front[0], restored_from=restored_from)

            try:
                run_service("learner", cfg, cfg.learner, [SERVICE_NAME],
                            learner_pb2_grpc.add_LearnerServicer_to_server, servicer, load, name=name,
                            security=security)
            finally:
                if front:
                    front[0].stop()
                if staging_server is not None:
                    staging_server.shutdown()
    except BaseException:
        dist.destroy_process_group()
        raise
    exit_learner_world(0)  # a clean stop must not end in an abort at interpreter exit


def shares_gpu_with_rollout(cfg: JobConfig, device, gpus: int) -> bool:
    """Under device=auto the learner takes GPU `replicas` mod the GPU count (`gpus`), so with no
    more GPUs than local rollout replicas it lands on one of theirs."""
    local_rollouts = not (cfg.rollout.address or cfg.rollout.addresses)
    return (cfg.learner.weight_backend == "auto" and device.type == "cuda" and local_rollouts
            and cfg.learner.device == "auto" and gpus <= cfg.rollout.replicas)


def learner_runtime_config(cfg: JobConfig, device, gpus: int) -> LearnerConfig:
    """The learner settings this process runs with: the job's, with `weight_backend: auto` resolved to
    gloo when the learner shares a GPU with a rollout whose engine cannot map CUDA IPC buffers (NCCL
    cannot put two ranks of one group on one GPU). The transformers engine reports its placement, so
    `auto` stays and picks CUDA IPC by it. A copy: the job config, which config.yaml records, stays
    as validated."""
    if shares_gpu_with_rollout(cfg, device, gpus) and cfg.rollout.backend != "hf":
        return cfg.learner.model_copy(update={"weight_backend": "gloo"})
    return cfg.learner


SERVERS = {"rollout": serve_rollout, "reward": serve_reward, "learner": serve_learner}
