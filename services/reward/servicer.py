"""Reward gRPC servicer: converts and delegates to RewardScorer."""
from __future__ import annotations

from rlfleet import types as t
from rlfleet.errors import NotReady
from rlfleet.metrics import ServiceMetrics
from rlfleet.proto.v1 import reward_pb2, reward_pb2_grpc
from rlfleet.rpc import convert, validate
from rlfleet.rpc.errors import rpc_method
from rlfleet.security_config import LimitsConfig
from services.reward.scorer import RewardScorer

SERVICE_NAME = reward_pb2.DESCRIPTOR.services_by_name["Reward"].full_name


class RewardServicer(reward_pb2_grpc.RewardServicer):
    role = "reward"

    def __init__(self, limits: LimitsConfig | None = None) -> None:
        """`limits`: the largest requests served (default: LimitsConfig's)."""
        self.limits = limits or LimitsConfig()
        self.metrics = ServiceMetrics.create(self.role)
        self.metrics_port = 0
        self.scorer: RewardScorer | None = None
        self.last_error = ""
        self.scored = 0

    def attach(self, scorer: RewardScorer) -> None:
        self.scorer = scorer

    @rpc_method
    def Score(self, request, context):
        if self.scorer is None:
            raise NotReady("reward service is still loading")
        validate.score(request, self.limits)
        items = convert.score_items_from_proto(request)
        with self.metrics.queued(len(items)):
            results = self.scorer.score(items, active=context.is_active)
        self.scored += len(results)
        return convert.score_results_to_proto(results)

    @rpc_method
    def GetStatus(self, request, context):
        return convert.status_to_proto(t.ServiceStatus(
            role=self.role, ready=self.scorer is not None, in_flight=self.metrics.in_flight_now() - 1,
            last_error=self.last_error, stats={"scored": float(self.scored), **self.metrics.load_stats()},
            metrics_port=self.metrics_port))
