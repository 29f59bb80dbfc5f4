"""Rollout gRPC servicer: converts and delegates to a RolloutEngine."""
from __future__ import annotations

import secrets
import threading

from rlfleet import types as t
from rlfleet.dataplane.plane import hold
from rlfleet.dataplane.push import PayloadPusher
from rlfleet.dataplane.store import PayloadStore
from rlfleet.errors import Busy, NotReady
from rlfleet.metrics import ServiceMetrics
from rlfleet.proto.v1 import rollout_pb2, rollout_pb2_grpc
from rlfleet.rpc import convert, validate
from rlfleet.rpc.errors import rpc_method
from rlfleet.rpc.exclusive import Exclusive
from rlfleet.security_config import LimitsConfig
from services.rollout.agent_loop import AgentLoop
from services.rollout.engine import RolloutEngine

_MAX_PENDING_JOINS = 4
SERVICE_NAME = rollout_pb2.DESCRIPTOR.services_by_name["Rollout"].full_name


class RolloutServicer(rollout_pb2_grpc.RolloutServicer):
    role = "rollout"

    def __init__(self, limits: LimitsConfig | None = None, weight_token: str | None = None) -> None:
        """`limits`: the largest requests served (default: LimitsConfig's); `weight_token`: the secret
        the weight group's rendezvous is signed with (security.token; None: unsigned)."""
        self.limits = limits or LimitsConfig()
        self.weight_token = weight_token
        self.metrics = ServiceMetrics.create(self.role)
        self.metrics_port = 0
        self.engine: RolloutEngine | None = None
        self.agent: AgentLoop | None = None  # multi-turn episodes against an environment server (env.*)
        # controller.data_plane=flight: (store, its Flight address); groups' tokens are held there
        self.payloads: tuple[PayloadStore, str] | None = None
        # and pushed to the learner's staging store (GenerateRequest.payload_sink) off the stream
        self.pusher: PayloadPusher | None = None
        self.last_error = ""
        # This process among others at the same address: the controller tells a restarted replica's
        # Join from a repeated (or spoofed) one by it (controller/fleet.py). 52 bits: exact as a double.
        self.instance = float(secrets.randbits(52))
        self.weight_ops = Exclusive("rollout")  # one pull at a time, the others refused at once
        # Joins run alongside pulls (see JoinWeightGroup); a few at once, so a flood of joins to
        # silent stores cannot take the server's threads.
        self._joins = threading.BoundedSemaphore(_MAX_PENDING_JOINS)

    def attach(self, engine: RolloutEngine, agent: AgentLoop | None = None) -> None:
        self.engine, self.agent = engine, agent
        self.metrics.policy_version.labels(self.role).set(engine.policy_version)

    def _ready(self) -> RolloutEngine:
        if self.engine is None:
            raise NotReady("rollout model is still loading")
        return self.engine

    @rpc_method
    def Generate(self, request, context):
        engine = self._ready()
        validate.generate(request, self.limits)
        params = convert.sampling_from_proto(request.params)
        prompts = convert.prompts_from_proto(request)
        episodes = self.agent is not None and any(p.row is not None for p in prompts)
        generate = self.agent.generate if episodes else engine.generate
        with self.metrics.queued(len(prompts)) as queue:
            for group in generate(prompts, params):
                queue.done()
                self.metrics.tokens.labels(self.role).inc(sum(len(c.token_ids) for c in group.completions))
                if self.payloads is not None:  # controller.data_plane=flight: the tokens stay here
                    group = hold(group, *self.payloads)
                    if request.payload_sink and self.pusher is not None:  # and go to the learner
                        self.pusher.push(request.payload_sink, group.request_id)
                yield convert.group_to_proto(group)

    @rpc_method
    def JoinWeightGroup(self, request, context):
        engine = self._ready()
        validate.join_weight_group(request, self.limits)
        timeout_s = request.timeout_s or min(120.0, self.limits.max_weight_timeout_s)
        # Not under weight_ops: the store connect (bounded by rlfleet.weights.group.STORE_CONNECT_S)
        # holds nothing, so a join to a store that never answers cannot hold up the controller's
        # join or pulls (issue 22); the engine swaps the new group in between pulls.
        if not self._joins.acquire(blocking=False):
            raise Busy(f"JoinWeightGroup refused: {_MAX_PENDING_JOINS} joins are already in progress on "
                       "this rollout; retry after they end")
        try:
            engine.join_weight_group(request.address, request.rank, request.world_size, request.backend,
                                     timeout_s, token=self.weight_token)
        finally:
            self._joins.release()
        return rollout_pb2.JoinWeightGroupResponse()

    @rpc_method
    def PullWeights(self, request, context):
        engine = self._ready()
        validate.version(request.version)
        with self.weight_ops.hold("PullWeights"):
            stats = engine.pull_weights(request.version)
            if request.digest:
                stats["digest"] = engine.weights_digest()
        self.metrics.weight_sync_seconds.labels(self.role).observe(stats["seconds"])
        self.metrics.policy_version.labels(self.role).set(stats["version"])
        return rollout_pb2.PullWeightsResponse(version=int(stats["version"]), bytes=int(stats["bytes"]),
                                               seconds=stats["seconds"], digest=stats.get("digest", ""))

    @rpc_method
    def GetStatus(self, request, context):
        return convert.status_to_proto(t.ServiceStatus(
            role=self.role, ready=self.engine is not None,
            policy_version=self.engine.policy_version if self.engine else 0,
            in_flight=self.metrics.in_flight_now() - 1,  # not counting this call
            last_error=self.last_error,
            stats={**self.metrics.load_stats(),
                   "weight_ranks": float(self.engine.weight_ranks if self.engine else 1),
                   "instance": self.instance, **(self.pusher.stats() if self.pusher is not None else {})},
            metrics_port=self.metrics_port, placement=self.engine.placement() if self.engine else ""))
