"""Typed clients for the three services: rlfleet.types in, rlfleet.types out.

gRPC failures become rlfleet errors whose message names the service, its
address and the RPC, so the controller can report them in one line
(controller/service_client.py: what the three share).
"""
from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Iterator


from controller.reward_tally import RewardTally
from controller.service_client import ServiceClient, rpc, rpc_errors
from rlfleet import types as t
from rlfleet.errors import RlfleetError
from rlfleet.proto.v1 import (
    learner_pb2,
    learner_pb2_grpc,
    reward_pb2_grpc,
    rollout_pb2,
    rollout_pb2_grpc,
)
from rlfleet.rpc import convert

TRAIN_METHOD = "/rlfleet.v1.Learner/Train"  # as learner_pb2_grpc names it
ABORT_TIMEOUT_S = 10.0  # AbortWeightGroup: the learner answers at once (it waits for nothing)
def watched_alive(client: RolloutClient) -> bool:
    """Whether `client`'s channel pings its service (`keepalive`, rlfleet.rpc.channel), so that the
    service is known to answer without asking it: a Generate stream open on it (a frozen or partitioned
    replica fails that stream within KEEPALIVE_S + KEEPALIVE_TIMEOUT_S), or, with no stream open, its
    connection still READY: pinged even with no call open, it is lost within the same bound when the
    replica stops answering (`connected`)."""
    return client.keepalive and (client.streams > 0 or client.connected)


class RolloutClient(ServiceClient):
    role = "rollout"
    stub_class = rollout_pb2_grpc.RolloutStub

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._stub = rollout_pb2_grpc.RolloutStub(self.channel)
        self.streams = 0  # Generate streams open now (on a kept-alive channel, each watches the replica)
        self.answered = 0.0  # time.monotonic() when a Generate stream last brought a group or ended OK
        self._counting = threading.Lock()
        # The replica's last status answer, with `connection_losses` as it was when asked (kept_status)
        self._kept: tuple[t.ServiceStatus, int] | None = None

    def status(self, timeout_s: float = 10.0) -> t.ServiceStatus:
        """The replica's status; the answer is kept (kept_status), a failure forgets the one kept."""
        losses = self.connection_losses  # read first: a loss during the call makes the answer stale
        try:
            status = super().status(timeout_s)
        except RlfleetError:
            self._kept = None
            raise
        self._kept = (status, losses)
        return status

    def kept_status(self) -> t.ServiceStatus | None:
        """The status this replica's process answered last (at its Join's call back, a re-form, a
        heartbeat), while it is surely that process's and the process is alive: the kept-alive
        connection is watched alive (watched_alive) and was not lost since the answer (a crash drops it,
        so a replica restarted at its address is asked again). None otherwise: ask it.

        Only what a process keeps for its life may be read from it (its weight ranks, placement,
        instance), not its load or version. A status asked before the asyncio channel first connected
        (the Join's call back comes before the member's first stream) is taken for that connection's
        process: a replica restarted in between Joins again, and its new member replaces this one."""
        kept = self._kept
        if kept is None or kept[1] != self.connection_losses or self.closed or not watched_alive(self):
            return None
        return kept[0]

    async def generate_async(self, prompts: list[t.PromptRequest], params: t.SamplingParams,
                             payload_sink: str = "") -> AsyncIterator[t.GroupResult]:
        """generate() on the running event loop (controller/stream_loop.py), over the asyncio channel;
        its failures translated alike."""
        stream = self._aio_stub_for("Generate").Generate(
            convert.generate_request_to_proto(prompts, params, payload_sink), timeout=self.timeout_s)
        self._streaming(+1)
        try:
            with self._aio_errors("Generate"):
                async for msg in stream:
                    self.answered = time.monotonic()
                    yield convert.group_from_proto(msg)
                self.answered = time.monotonic()
        finally:
            self._streaming(-1)

    def _streaming(self, delta: int) -> None:
        with self._counting:
            self.streams += delta

    def generate(self, prompts: list[t.PromptRequest], params: t.SamplingParams,
                 payload_sink: str = "") -> Iterator[t.GroupResult]:
        """`payload_sink`: data_plane=flight, the learner's staging store the replica pushes groups to."""
        with rpc_errors(self, "Generate"):
            stream = self._stub.Generate(convert.generate_request_to_proto(prompts, params, payload_sink),
                                         timeout=self.timeout_s)
            self._streaming(+1)
            try:
                for msg in stream:
                    self.answered = time.monotonic()
                    yield convert.group_from_proto(msg)
                self.answered = time.monotonic()
            finally:
                self._streaming(-1)

    @rpc
    def join_weight_group(self, address: str, rank: int, world_size: int, backend: str,
                          timeout_s: float) -> None:
        self._stub.JoinWeightGroup(rollout_pb2.JoinWeightGroupRequest(
            address=address, rank=rank, world_size=world_size, backend=backend, timeout_s=timeout_s),
            timeout=30)

    @rpc
    def pull_weights(self, version: int, timeout_s: float,
                     digest: bool = False) -> rollout_pb2.PullWeightsResponse:
        return self._stub.PullWeights(rollout_pb2.PullWeightsRequest(version=version, digest=digest),
                                      timeout=timeout_s)


class RewardClient(ServiceClient):
    role = "reward"
    stub_class = reward_pb2_grpc.RewardStub

    def __init__(self, *args, tally: RewardTally | None = None, **kwargs):
        """`tally`: under `reward.sources`, adds up each reply's per-source scores and costs."""
        super().__init__(*args, **kwargs)
        self._stub = reward_pb2_grpc.RewardStub(self.channel)
        self.tally = tally

    @rpc
    def score(self, items: list[t.ScoreItem]) -> list[t.ScoreResult]:
        reply = self._stub.Score(convert.score_items_to_proto(items), timeout=self.timeout_s)
        return self._results(items, reply)

    async def score_async(self, items: list[t.ScoreItem]) -> list[t.ScoreResult]:
        """score() on the running event loop (the controller's, where groups arrive: issue 44), over
        the asyncio channel; its failures translated alike."""
        stub = self._aio_stub_for("score")
        with self._aio_errors("score"):  # named as the blocking call names it
            reply = await stub.Score(convert.score_items_to_proto(items), timeout=self.timeout_s)
        return self._results(items, reply)

    def _results(self, items: list[t.ScoreItem], reply) -> list[t.ScoreResult]:
        """The reply's results, checked against the items asked for, and tallied."""
        results = convert.score_results_from_proto(reply)
        if [r.id for r in results] != [i.id for i in items]:
            raise RlfleetError(f"reward service at {self.address} returned {len(results)} results for "
                               f"{len(items)} items (or out of order)")
        if self.tally is not None:
            self.tally.add(results)
        return results

    def step_metrics(self, groups: list) -> dict[str, float]:
        """`reward/<source>/…` and `reward/excluded_total` under `reward.sources`, else nothing."""
        return self.tally.step_metrics(groups) if self.tally is not None else {}


class LearnerClient(ServiceClient):
    role = "learner"
    stub_class = learner_pb2_grpc.LearnerStub

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._stub = learner_pb2_grpc.LearnerStub(self.channel)
        # Train with a request already serialized (a batch with its groups' request bytes): the same
        # method, its bytes passed through as they are
        self._train_wire = self.channel.unary_unary(TRAIN_METHOD, request_serializer=None,
                                                    response_deserializer=learner_pb2.TrainResponse.FromString)

    @rpc
    def train(self, batch: t.TrainBatch) -> t.TrainResult:
        parts = getattr(batch, "sample_wire", None)  # controller.train_parts.EncodedTrainBatch
        if parts is not None:
            reply = self._train_wire(convert.train_request_wire(batch, parts), timeout=self.timeout_s)
        else:
            reply = self._stub.Train(convert.train_batch_to_proto(batch), timeout=self.timeout_s)
        return t.TrainResult(policy_version=reply.policy_version, metrics=dict(reply.metrics))

    @rpc
    def open_weight_group(self, world_size: int, timeout_s: float,
                          placements: list[str] | None = None) -> tuple[str, str]:
        reply = self._stub.OpenWeightGroup(
            learner_pb2.OpenWeightGroupRequest(world_size=world_size, timeout_s=timeout_s,
                                               member_placements=placements or []), timeout=30)
        return reply.address, reply.backend

    @rpc
    def push_weights(self, version: int, timeout_s: float, digest: bool = False,
                     group: str = "") -> learner_pb2.PushWeightsResponse:
        """`group`: the address open_weight_group returned (the learner may host others)."""
        return self._stub.PushWeights(learner_pb2.PushWeightsRequest(version=version, digest=digest,
                                                                     group=group),
                                      timeout=timeout_s)

    @rpc
    def abort_weight_group(self, group: str, reason: str) -> bool:
        """Ends the learner's push to `group` at once; whether one was on it."""
        request = learner_pb2.AbortWeightGroupRequest(group=group, reason=reason[:500])
        return self._stub.AbortWeightGroup(request, timeout=min(self.timeout_s, ABORT_TIMEOUT_S)).pushing

    @rpc
    def save_checkpoint(self, step: int) -> str:
        return self._stub.SaveCheckpoint(learner_pb2.SaveCheckpointRequest(step=step),
                                         timeout=self.timeout_s).path

    @rpc
    def checkpoints(self) -> dict[int, str]:
        """The learner's complete checkpoints by step (paths on its machine), the one it started from
        included: what a resumed run can continue from."""
        reply = self._stub.ListCheckpoints(learner_pb2.ListCheckpointsRequest(), timeout=self.timeout_s)
        found = {c.step: c.path for c in reply.checkpoints}
        if reply.HasField("restored_from"):
            found[reply.restored_from.step] = reply.restored_from.path
        return found
