"""Staging on the data plane (issue 44), in process over real gRPC and Flight servers: the rollout
servicer (tiny model) holds each group it generates and pushes it, off the Generate stream, to the
learner's staging store named in GenerateRequest.payload_sink (which the learner reports in GetStatus);
a Train whose groups are all staged fetches nothing (the replica's Flight server is shut down before it)
and trains exactly what the inline request trains; a learner full beyond its bound refuses a push (the
replica counts it, keeps its copy) and that group is fetched from the replica at Train time."""
from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import structlog.testing
import torch

from rlfleet.config import LearnerConfig
from rlfleet.dataplane.flight import PayloadClient, PayloadServer
from rlfleet.dataplane.payload import TokenPayload, to_table
from rlfleet.dataplane.push import PayloadPusher
from rlfleet.dataplane.staging import StagingStore, staged_key
from rlfleet.dataplane.store import MemoryStore
from rlfleet.proto.v1 import common_pb2, learner_pb2, learner_pb2_grpc, rollout_pb2, rollout_pb2_grpc
from rlfleet.rpc.convert import group_from_proto, train_batch_to_proto
from rlfleet.types import GroupResult, TrainBatch, TrainSample
from tests.service.servicer_harness import TIMEOUT, Running, attach, code_of, details_of, make_learner

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]

PROMPTS = {"p0-s0": [6, 7, 41, 8, 45], "p1-s1": [15, 16]}


@dataclass
class Plane:
    replica: PayloadServer  # the rollout's data plane
    pusher: PayloadPusher
    staging: PayloadServer  # the learner's
    rollout: rollout_pb2_grpc.RolloutStub
    learner: learner_pb2_grpc.LearnerStub
    learner_running: Running


@pytest.fixture
def plane(started: Callable[[str], Running], hf_engine, tiny_model_dir: Path, tmp_path: Path
          ) -> Iterator[Callable[[int], Plane]]:
    servers: list[PayloadServer] = []
    pushers: list[PayloadPusher] = []

    def build(staging_tokens: int) -> Plane:
        rollout = started("rollout")
        replica = PayloadServer(MemoryStore())
        pusher = PayloadPusher(replica.store, replica.address, PayloadClient(timeout_s=10))
        rollout.servicer.payloads, rollout.servicer.pusher = (replica.store, replica.address), pusher
        attach("rollout", rollout, hf_engine)
        learner = started("learner")
        staging = PayloadServer(StagingStore(staging_tokens))
        learner.servicer.payloads = PayloadClient(timeout_s=10)
        learner.servicer.staging, learner.servicer.payload_sink = staging.store, staging.address
        attach("learner", learner, make_learner(tiny_model_dir, LearnerConfig(lr=1e-3, micro_batch_tokens=16),
                                                tmp_path / f"ckpt{len(servers)}"))
        servers.extend([replica, staging])
        pushers.append(pusher)
        return Plane(replica, pusher, staging, rollout_pb2_grpc.RolloutStub(rollout.channel),
                     learner_pb2_grpc.LearnerStub(learner.channel), learner)

    yield build
    for pusher in pushers:
        pusher.close()
    for server in servers:
        server.shutdown()


def _generate(p: Plane, sink: str, prompts: dict[str, list[int]] = PROMPTS) -> list[GroupResult]:
    request = rollout_pb2.GenerateRequest(
        prompts=[rollout_pb2.PromptInput(request_id=rid, prompt_ids=ids) for rid, ids in prompts.items()],
        params=common_pb2.SamplingParams(n=3, temperature=1.0, max_new_tokens=5, seed=3), payload_sink=sink)
    return [group_from_proto(m) for m in p.rollout.Generate(request, timeout=TIMEOUT)]


def _train_request(groups: list[GroupResult], tokens: dict[str, list] | None = None,
                   step: int = 1) -> learner_pb2.TrainRequest:
    """The controller's request (references), or with `tokens` (request id: payloads) the inline one."""
    samples = []
    for g in groups:
        for i, c in enumerate(g.completions):
            p = tokens[g.request_id][i] if tokens else None
            samples.append(TrainSample([6, 7, 8], p.token_ids if p else [], p.logprobs if p else [],
                                       0.5 - 0.25 * i, c.policy_version, payload=None if p else c.payload))
    return train_batch_to_proto(TrainBatch(step, samples, 1.0, step - 1))


def test_the_learner_reports_its_sink_and_a_bad_sink_is_refused(plane):
    p = plane(10_000)
    status = p.learner.GetStatus(common_pb2.GetStatusRequest(), timeout=TIMEOUT)
    assert status.payload_sink == p.staging.address
    request = rollout_pb2.GenerateRequest(prompts=[rollout_pb2.PromptInput(request_id="a", prompt_ids=[5])],
                                          params=common_pb2.SamplingParams(n=1, max_new_tokens=2),
                                          payload_sink="no-port")
    call = lambda: p.rollout.Generate(request, timeout=TIMEOUT)  # noqa: E731
    assert code_of(call) == grpc.StatusCode.INVALID_ARGUMENT
    assert "payload_sink must be 'host:port', got 'no-port'" in details_of(call)


def test_a_train_whose_groups_are_staged_fetches_nothing_and_trains_as_inline(plane):
    p = plane(10_000)
    groups = _generate(p, p.staging.address)
    assert all(not c.token_ids and c.payload is not None for g in groups for c in g.completions)
    assert p.pusher.wait_idle(30)
    status = p.rollout.GetStatus(common_pb2.GetStatusRequest(), timeout=TIMEOUT)
    assert status.stats["payload_pushed"] == 2 and status.stats["payload_push_failed"] == 0
    keys = [staged_key(p.replica.address, rid) for rid in PROMPTS]
    assert sorted(p.staging.store.held()) == sorted(keys)
    held = p.replica.store.get(PROMPTS)  # the replica keeps its copy until released
    p.replica.shutdown()  # a fetch from the replica would now fail: the batch must come from staging
    reply = p.learner.Train(_train_request(groups), timeout=TIMEOUT)
    assert reply.policy_version == 1
    assert sorted(p.staging.store.held()) == sorted(keys)  # kept for a retry of this step's Train

    # the same batch inline, on a fresh learner: the same step
    inline = plane(10_000)
    inline_reply = inline.learner.Train(_train_request(groups, held), timeout=TIMEOUT)
    assert dict(reply.metrics)["actor/pg_loss"] == dict(inline_reply.metrics)["actor/pg_loss"]
    staged_model = p.learner_running.servicer.learner.model
    inline_model = inline.learner_running.servicer.learner.model
    for (name, a), (_, b) in zip(staged_model.named_parameters(), inline_model.named_parameters()):
        assert torch.equal(a, b), name

    # the next step's groups are staged too (the pusher reads the replica's own store, not its server);
    # its Train releases this step's from the staging store
    later = {"p2-s2": [9, 10], "p3-s3": [11]}
    second = _generate(p, p.staging.address, later)
    assert p.pusher.wait_idle(30)
    assert p.learner.Train(_train_request(second, step=2), timeout=TIMEOUT).policy_version == 2
    assert sorted(p.staging.store.held()) == sorted(staged_key(p.replica.address, rid) for rid in later)


def test_a_push_beyond_the_bound_is_refused_and_its_group_fetched_at_train(plane):
    p = plane(1)  # every group holds 3 samples of >= 1 token: each push is refused
    groups = _generate(p, p.staging.address)
    assert p.pusher.wait_idle(30)
    status = p.rollout.GetStatus(common_pb2.GetStatusRequest(), timeout=TIMEOUT).stats
    assert (status["payload_pushed"], status["payload_push_failed"]) == (0, 2)
    assert p.staging.store.held() == []
    assert sorted(p.replica.store.held()) == sorted(PROMPTS)  # the replica kept its copies
    assert p.learner.Train(_train_request(groups), timeout=TIMEOUT).policy_version == 1  # fetched
    # trained groups leave their replica at the next checkpoint (off the call: waited for here)
    p.learner.SaveCheckpoint(learner_pb2.SaveCheckpointRequest(step=1), timeout=TIMEOUT)
    deadline = time.monotonic() + 60
    while p.replica.store.held():
        assert time.monotonic() < deadline, "the trained groups were never released at their replica"
        time.sleep(0.05)


def test_a_checkpoint_does_not_wait_for_releases_at_a_replica_that_does_not_answer(plane):
    """Groups trained before a checkpoint are released at their replicas then; a replica that died
    without closing its socket (a host gone) answers nothing: a release to it fails only after gRPC's
    20 s connection timeout (seen here) or the data plane's deadline, one replica after the other. With
    staging the learner trains groups of replicas long dead, so those releases must not hold up the
    SaveCheckpoint call (its deadline here: 10 s)."""
    p = plane(10_000)
    silent = socket.socket()  # accepts connections (the kernel's backlog), never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        servicer = p.learner_running.servicer
        servicer.payloads = PayloadClient(timeout_s=120)
        servicer._unreleased = [(f"127.0.0.1:{silent.getsockname()[1]}", ["p0-s0"])]  # trained, not released
        reply = p.learner.SaveCheckpoint(learner_pb2.SaveCheckpointRequest(step=0), timeout=10)
        assert reply.path.endswith("step_0")
    finally:
        silent.close()  # the release then fails at once


def test_pushes_to_a_sink_that_is_gone_are_counted_and_logged_once():
    gone = socket.socket()
    gone.bind(("127.0.0.1", 0))
    sink = f"127.0.0.1:{gone.getsockname()[1]}"
    gone.close()  # nothing listens there: each put is refused at once
    store = MemoryStore()
    pusher = PayloadPusher(store, "127.0.0.1:1", PayloadClient(timeout_s=10))
    try:
        with structlog.testing.capture_logs() as logs:
            for rid in ("a", "b"):
                store.put(rid, [TokenPayload([1, 2], [-1.0, -0.5], 0)])
                pusher.push(sink, rid)
                assert pusher.wait_idle(30)  # one put each
            pusher.push(sink, "released")  # not held (released meanwhile): nothing to push
            assert pusher.wait_idle(30)
    finally:
        pusher.close()
    assert pusher.stats() == {"payload_pushed": 0.0, "payload_push_failed": 2.0, "payload_push_dropped": 0.0}
    warned = [e for e in logs if e["event"].startswith("data plane push to the learner failed")]
    assert len(warned) == 1 and warned[0]["sink"] == sink
    assert sorted(store.held()) == ["a", "b"]  # the replica keeps its copies


def test_a_sample_that_names_a_payload_and_carries_tokens_is_refused(plane):
    p = plane(10_000)
    sample = learner_pb2.TrainSample(prompt_ids=[6, 7], response_ids=[9], behaviour_logprobs=[-1.0],
                                     advantage=1.0, payload=learner_pb2.PayloadRef(address="10.0.0.1:1",
                                                                                 request_id="p0-s0"))
    staged = {staged_key("10.0.0.1:1", "p0-s0")}  # as if staged: fetch_columns leaves it, validate sees it
    p.staging.store.put_table(to_table({"p0-s0": [TokenPayload([9], [-1.0], 0)]}), "10.0.0.1:1")
    assert set(p.staging.store.held()) == staged
    request = learner_pb2.TrainRequest(step=1, samples=[sample], temperature=1.0, expected_version=0)
    call = lambda: p.learner.Train(request, timeout=TIMEOUT)  # noqa: E731
    assert code_of(call) == grpc.StatusCode.INVALID_ARGUMENT
    assert "sample 0: names a payload and also carries response tokens" in details_of(call)
