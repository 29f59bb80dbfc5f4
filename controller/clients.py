"""Typed clients for the three services: rlfleet.types in, rlfleet.types out.

gRPC failures become rlfleet errors whose message names the service, its
address and the RPC, so the controller can report them in one line.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator

import grpc
import grpc.aio

from controller.reward_tally import RewardTally
from rlfleet import types as t
from rlfleet.errors import Busy, PeerSilent, RlfleetError, ServiceUnavailable, WeightSyncError
from rlfleet.proto.v1 import (
    common_pb2,
    learner_pb2,
    learner_pb2_grpc,
    reward_pb2_grpc,
    rollout_pb2,
    rollout_pb2_grpc,
)
from rlfleet.rpc import convert
from rlfleet.rpc.aio_channel import AioChannel, open_aio_channel
from rlfleet.rpc.call_release import release_call
from rlfleet.rpc.channel import REPORT_EVERY_S, keepalive_options, wait_until_serving
from rlfleet.rpc.security import Security

TRAIN_METHOD = "/rlfleet.v1.Learner/Train"  # as learner_pb2_grpc names it
ABORT_TIMEOUT_S = 10.0  # AbortWeightGroup: the learner answers at once (it waits for nothing)
_UNREACHABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
# How grpc words a call failed by an unanswered keepalive ping (1.85: "Stream removed (ping timeout)";
# older releases: "keepalive watchdog timeout")
_SILENT_WORDS = ("ping timeout", "keepalive watchdog timeout")


def _translate(role: str, address: str, rpc: str, err: grpc.RpcError) -> RlfleetError:
    code = err.code() if hasattr(err, "code") else None
    detail = err.details() if hasattr(err, "details") else str(err)
    message = f"{role} service at {address}: {rpc} failed with {code.name if code else '?'}: {detail}"
    if code == grpc.StatusCode.UNAVAILABLE and any(words in (detail or "") for words in _SILENT_WORDS):
        return PeerSilent(message)
    if code in _UNREACHABLE:
        return ServiceUnavailable(message)
    if code == grpc.StatusCode.ABORTED:
        return WeightSyncError(message)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and detail.startswith("Busy:"):
        return Busy(message)  # another weight operation runs there: worth a retry once it ends
    return RlfleetError(message)


# How grpc words a call on a channel this process closed: a unary call, a stream
_CLOSED_WORDS = ("closed channel", "Channel closed")


def _closed(role: str, address: str, rpc: str) -> ServiceUnavailable:
    return ServiceUnavailable(f"{role} service at {address}: {rpc} failed: the channel was closed "
                              "(the replica left the fleet or rejoined)")


@contextlib.contextmanager
def _rpc_errors(client: _Client, rpc: str) -> Iterator[None]:
    """gRPC failures inside become rlfleet errors naming the service, its address and the RPC.

    The fleet closes a member's channel when it leaves or rejoins after a restart, while a thread may
    still be asking the old member: to that thread the replica is as unreachable as a dead one. A call
    on a channel the client closed is refused before grpc sees it (grpc raises a bare ValueError, and a
    stream started on a closed channel that never carried one crashed the process, issue 34)."""
    if client.closed:
        raise _closed(client.role, client.address, rpc)
    try:
        yield
    except grpc.RpcError as err:
        release_call(err)  # a failed Generate stream: freed with the error, not at the final collection
        raise _translate(client.role, client.address, rpc, err) from None
    except ValueError as err:  # closed by another thread during the call
        if not any(words in str(err) for words in _CLOSED_WORDS):
            raise
        raise _closed(client.role, client.address, rpc) from None


def _rpc(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        with _rpc_errors(self, fn.__name__):
            return fn(self, *args, **kwargs)
    return wrapper


class _Client:
    role = ""
    stub_class: Callable = object  # the service's generated stub, made on the asyncio channel

    def __init__(self, address: str, timeout_s: float, connect_timeout_s: float = 60.0, alive=lambda: True,
                 security: Security | None = None, report_every_s: float | None = REPORT_EVERY_S,
                 keepalive: bool = False):
        """`security`: the job's TLS and bearer token (None: plain gRPC); `report_every_s`: how often the
        wait for the service says so (None: never, for a short check whose failure is reported anyway);
        `keepalive`: the channel pings the service while a call is open (rlfleet.rpc.channel
        keepalive_options), so a call to a service that stops answering fails (PeerSilent) within
        KEEPALIVE_S + KEEPALIVE_TIMEOUT_S rather than at its deadline."""
        self.address = address
        self.timeout_s = timeout_s
        self.closed = False
        self.keepalive = keepalive
        self.security = security
        self.extra_options = keepalive_options() if keepalive else None
        self.channel = wait_until_serving(address, self.role, connect_timeout_s, alive, security,
                                          report_every_s=report_every_s if report_every_s else float("inf"),
                                          extra_options=self.extra_options)
        self._aio: AioChannel | None = None  # calls made on the controller's event loop
        self._aio_loop: asyncio.AbstractEventLoop | None = None
        self._aio_stub = None  # the stub on self._aio, made once a channel (not once a call)
        # With keepalive, the asyncio channel's connection is pinged even with no call open, so it stays
        # READY only while the service answers: `connected` follows it (_watch_connection), and the
        # fleet's heartbeat asks no status of a member whose connection is READY (issue 44)
        self.connected = False
        # Times that connection left READY (lost, or closed), or the channel was replaced: what a call
        # learned of the service's process before may be another process's now (RolloutClient.kept_status)
        self.connection_losses = 0
        self._connection_watch: asyncio.Task | None = None

    @_rpc
    def status(self, timeout_s: float = 10.0) -> t.ServiceStatus:
        return convert.status_from_proto(self._stub.GetStatus(common_pb2.GetStatusRequest(),
                                                              timeout=timeout_s))

    def close(self) -> None:
        self.closed = True
        self.connected = False
        self.connection_losses += 1
        self.channel.close()
        self._close_streams()

    # ---- calls on an event loop (controller/stream_loop.py) -------------------------------------
    def _aio_channel(self, rpc: str) -> AioChannel:
        """The asyncio channel, with the same options as the blocking one (TLS, token, keepalive,
        request ids), opened on first use on the running loop (grpc.aio binds a channel to it)."""
        if self.closed:
            raise _closed(self.role, self.address, rpc)
        loop = asyncio.get_running_loop()
        if self._aio is None or self._aio_loop is not loop:
            if self._aio is not None:  # a new connection, maybe to another process than the old one's
                self.connection_losses += 1
            self._aio = open_aio_channel(self.address, self.security, self.extra_options)
            self._aio_loop = loop
            self._aio_stub = self.stub_class(self._aio)
            if self.keepalive:
                self._connection_watch = loop.create_task(self._watch_connection(self._aio))
            if self.closed:  # close() ran meanwhile, on another thread, before this channel existed
                self._close_streams()
                raise _closed(self.role, self.address, rpc)
        return self._aio

    async def connect_async(self) -> None:
        """Opens the asyncio channel on the running loop now (a first Generate does so too) and, with
        keepalive, waits until `connected` says whether its connection came up (READY) or not."""
        self._aio_channel("connect")
        while self.keepalive and not self.connected and not self.connection_watch_done():
            await asyncio.sleep(0.01)

    def connection_watch_done(self) -> bool:
        """Whether the watch of the asyncio channel's connection ended (never started, or closed)."""
        return self._connection_watch is None or self._connection_watch.done()

    def _aio_stub_for(self, rpc: str):
        """The service's stub on the asyncio channel (opened if need be); its calls carry the
        request id, the step and the token (rlfleet.rpc.aio_channel.AioChannel)."""
        self._aio_channel(rpc)
        return self._aio_stub

    async def _watch_connection(self, channel: AioChannel) -> None:
        """Keeps `connected` true while `channel` is READY, until it closes; a connection lost (its
        pings unanswered for KEEPALIVE_TIMEOUT_S, or closed by the peer) is asked for again at once, so
        a replica that answers again is watched again. Woken only by a change of state: no polling.
        A channel replaced by one on another loop stops speaking for the client. Every departure from
        READY counts in `connection_losses`, however soon the connection comes back: the state it
        went back to may already be READY again, to a replica restarted at the same address."""
        ready, shutdown = grpc.ChannelConnectivity.READY, grpc.ChannelConnectivity.SHUTDOWN
        try:
            state = channel.get_state(try_to_connect=True)
            while state != shutdown and not self.closed and channel is self._aio:
                self.connected = state == ready
                await channel.wait_for_state_change(state)
                if state == ready and channel is self._aio:
                    self.connection_losses += 1
                state = channel.get_state(try_to_connect=True)
        finally:
            if channel is self._aio:
                self.connected = False

    @contextlib.contextmanager
    def _aio_errors(self, rpc: str) -> Iterator[None]:
        """As _rpc_errors, for a call on the asyncio channel: its failures translated alike."""
        try:
            yield
        except grpc.RpcError as err:
            if self.closed:  # its channel closed under it: the service left or the run stops
                raise _closed(self.role, self.address, rpc) from None
            raise _translate(self.role, self.address, rpc, err) from None
        except grpc.aio.UsageError:  # the channel closed before the call started
            raise _closed(self.role, self.address, rpc) from None
        except asyncio.CancelledError:
            # grpc.aio cancels the calls of a channel closed under them (a drain's timeout, a leave):
            # that is the service gone, as for a blocking call; the task's own cancellation goes on
            task = asyncio.current_task()
            if (task is not None and task.cancelling()) or not self.closed:
                raise
            raise _closed(self.role, self.address, rpc) from None

    def _close_streams(self) -> None:
        """Closes the asyncio channel on its loop (its open calls fail CANCELLED there), from any
        thread; a loop already stopped took its calls along."""
        channel, loop = self._aio, self._aio_loop
        if channel is None or loop is None or not loop.is_running():
            return
        try:
            asyncio.run_coroutine_threadsafe(channel.close(), loop)
        except RuntimeError:  # the loop closed meanwhile
            pass

    async def close_streams(self) -> None:
        """Closes the asyncio channel, on its loop (the run stops), and lets its connection watch end
        before the loop stops (a task left pending there is reported when the loop is collected)."""
        if self._aio is not None:
            await self._aio.close()
        if self._connection_watch is not None:
            await asyncio.wait([self._connection_watch], timeout=1.0)


def watched_alive(client: RolloutClient) -> bool:
    """Whether `client`'s channel pings its service (`keepalive`, rlfleet.rpc.channel), so that the
    service is known to answer without asking it: a Generate stream open on it (a frozen or partitioned
    replica fails that stream within KEEPALIVE_S + KEEPALIVE_TIMEOUT_S), or, with no stream open, its
    connection still READY: pinged even with no call open, it is lost within the same bound when the
    replica stops answering (`connected`)."""
    return client.keepalive and (client.streams > 0 or client.connected)


class RolloutClient(_Client):
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
        with _rpc_errors(self, "Generate"):
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

    @_rpc
    def join_weight_group(self, address: str, rank: int, world_size: int, backend: str,
                          timeout_s: float) -> None:
        self._stub.JoinWeightGroup(rollout_pb2.JoinWeightGroupRequest(
            address=address, rank=rank, world_size=world_size, backend=backend, timeout_s=timeout_s),
            timeout=30)

    @_rpc
    def pull_weights(self, version: int, timeout_s: float,
                     digest: bool = False) -> rollout_pb2.PullWeightsResponse:
        return self._stub.PullWeights(rollout_pb2.PullWeightsRequest(version=version, digest=digest),
                                      timeout=timeout_s)


class RewardClient(_Client):
    role = "reward"
    stub_class = reward_pb2_grpc.RewardStub

    def __init__(self, *args, tally: RewardTally | None = None, **kwargs):
        """`tally`: under `reward.sources`, adds up each reply's per-source scores and costs."""
        super().__init__(*args, **kwargs)
        self._stub = reward_pb2_grpc.RewardStub(self.channel)
        self.tally = tally

    @_rpc
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


class LearnerClient(_Client):
    role = "learner"
    stub_class = learner_pb2_grpc.LearnerStub

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._stub = learner_pb2_grpc.LearnerStub(self.channel)
        # Train with a request already serialized (a batch with its groups' request bytes): the same
        # method, its bytes passed through as they are
        self._train_wire = self.channel.unary_unary(TRAIN_METHOD, request_serializer=None,
                                                    response_deserializer=learner_pb2.TrainResponse.FromString)

    @_rpc
    def train(self, batch: t.TrainBatch) -> t.TrainResult:
        parts = getattr(batch, "sample_wire", None)  # controller.train_parts.EncodedTrainBatch
        if parts is not None:
            reply = self._train_wire(convert.train_request_wire(batch, parts), timeout=self.timeout_s)
        else:
            reply = self._stub.Train(convert.train_batch_to_proto(batch), timeout=self.timeout_s)
        return t.TrainResult(policy_version=reply.policy_version, metrics=dict(reply.metrics))

    @_rpc
    def open_weight_group(self, world_size: int, timeout_s: float,
                          placements: list[str] | None = None) -> tuple[str, str]:
        reply = self._stub.OpenWeightGroup(
            learner_pb2.OpenWeightGroupRequest(world_size=world_size, timeout_s=timeout_s,
                                               member_placements=placements or []), timeout=30)
        return reply.address, reply.backend

    @_rpc
    def push_weights(self, version: int, timeout_s: float, digest: bool = False,
                     group: str = "") -> learner_pb2.PushWeightsResponse:
        """`group`: the address open_weight_group returned (the learner may host others)."""
        return self._stub.PushWeights(learner_pb2.PushWeightsRequest(version=version, digest=digest,
                                                                     group=group),
                                      timeout=timeout_s)

    @_rpc
    def abort_weight_group(self, group: str, reason: str) -> bool:
        """Ends the learner's push to `group` at once; whether one was on it."""
        request = learner_pb2.AbortWeightGroupRequest(group=group, reason=reason[:500])
        return self._stub.AbortWeightGroup(request, timeout=min(self.timeout_s, ABORT_TIMEOUT_S)).pushing

    @_rpc
    def save_checkpoint(self, step: int) -> str:
        return self._stub.SaveCheckpoint(learner_pb2.SaveCheckpointRequest(step=step),
                                         timeout=self.timeout_s).path

    @_rpc
    def checkpoints(self) -> dict[int, str]:
        """The learner's complete checkpoints by step (paths on its machine), the one it started from
        included: what a resumed run can continue from."""
        reply = self._stub.ListCheckpoints(learner_pb2.ListCheckpointsRequest(), timeout=self.timeout_s)
        found = {c.step: c.path for c in reply.checkpoints}
        if reply.HasField("restored_from"):
            found[reply.restored_from.step] = reply.restored_from.path
        return found
