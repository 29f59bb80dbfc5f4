"""`rlfleet serve ROLE`: builds one service's core and runs it."""
from __future__ import annotations

from rlfleet.config import JobConfig
from rlfleet.devices import resolve_device, resolve_dtype
from rlfleet.rpc.service_main import run_service

ROLES = ("rollout", "reward", "learner")


def serve_rollout(cfg: JobConfig) -> None:
    from rlfleet.models.resolve import resolve_model_path
    from rlfleet.proto.v1 import rollout_pb2_grpc
    from services.rollout.engines.hf import HFEngine
    from services.rollout.servicer import SERVICE_NAME, RolloutServicer
    from services.rollout.worker import RolloutWorker

    servicer = RolloutServicer()

    def load() -> None:
        device = resolve_device(cfg.rollout.device, prefer_index=0)
        engine = HFEngine(resolve_model_path(cfg.model.path), device, resolve_dtype(cfg.model.dtype, device),
                          cfg.rollout.max_batch_sequences)
        servicer.attach(RolloutWorker(engine))

    run_service("rollout", cfg, cfg.rollout, [SERVICE_NAME], rollout_pb2_grpc.add_RolloutServicer_to_server,
                servicer, load)


def serve_reward(cfg: JobConfig) -> None:
    from rlfleet.proto.v1 import reward_pb2_grpc
    from services.reward.scorer import RewardScorer
    from services.reward.servicer import SERVICE_NAME, RewardServicer

    servicer = RewardServicer()
    run_service("reward", cfg, cfg.reward, [SERVICE_NAME], reward_pb2_grpc.add_RewardServicer_to_server,
                servicer, lambda: servicer.attach(RewardScorer(cfg.reward.fn)))


def serve_learner(cfg: JobConfig) -> None:
    from rlfleet.models.resolve import resolve_model_path
    from rlfleet.proto.v1 import learner_pb2_grpc
    from services.learner.learner import Learner
    from services.learner.servicer import SERVICE_NAME, LearnerServicer

    servicer = LearnerServicer(host=cfg.learner.host)

    def load() -> None:
        # With two GPUs the learner takes the second one, leaving the first to the rollout.
        device = resolve_device(cfg.learner.device, prefer_index=1)
        servicer.attach(Learner(cfg.learner, resolve_model_path(cfg.model.path), device,
                                resolve_dtype(cfg.model.dtype, device), cfg.run.dir / "checkpoints",
                                seed=cfg.run.seed))

    run_service("learner", cfg, cfg.learner, [SERVICE_NAME], learner_pb2_grpc.add_LearnerServicer_to_server,
                servicer, load)


SERVERS = {"rollout": serve_rollout, "reward": serve_reward, "learner": serve_learner}
