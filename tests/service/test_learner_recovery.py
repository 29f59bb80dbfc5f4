"""Train is idempotent by (step, expected version), so the controller may retry a call that timed out;
a learner that restarted behind the controller gets advice that fits the run's checkpoints.

The real learner on the tiny model behind an in-process gRPC server; the controller side is the
loop's own Recovery driving a real LearnerClient.
"""
from __future__ import annotations

import threading
import time

import grpc
import pytest
import torch

from controller.clients import LearnerClient
from controller.loop import GRPOLoop
from rlfleet.config import JobConfig
from rlfleet.errors import RlfleetError
from rlfleet.proto.v1 import common_pb2, learner_pb2_grpc
from rlfleet.types import TrainBatch, TrainSample
from tests.service.servicer_harness import TIMEOUT, code_of, details_of
from tests.service.test_learner_servicer import train_request

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]


def weights(learner) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in learner.model.named_parameters()}


def version_of(stub) -> int:
    return stub.GetStatus(common_pb2.GetStatusRequest(), timeout=TIMEOUT).policy_version


def test_a_repeated_step_returns_its_stored_result_and_trains_nothing(learner_server):
    stub = learner_pb2_grpc.LearnerStub(learner_server.channel)
    core = learner_server.servicer.learner
    first = stub.Train(train_request(step=1, expected_version=0), timeout=TIMEOUT)
    assert first.policy_version == 1
    after_first = weights(core)

    again = stub.Train(train_request(step=1, expected_version=0), timeout=TIMEOUT)  # e.g. a retry
    assert again.policy_version == 1 and dict(again.metrics) == dict(first.metrics)
    assert version_of(stub) == 1
    assert all(torch.equal(after_first[n], w) for n, w in weights(core).items())  # no second optimizer step

    # The same key with other samples is no repeat: the version check refuses it.
    other = train_request(step=1, expected_version=0, logprobs=[-1.0, -2.0])
    assert code_of(lambda: stub.Train(other, timeout=TIMEOUT)) == grpc.StatusCode.FAILED_PRECONDITION
    assert stub.Train(train_request(step=2, expected_version=1), timeout=TIMEOUT).policy_version == 2


def test_train_without_expected_version_is_refused_so_it_cannot_train_twice(learner_server):
    stub = learner_pb2_grpc.LearnerStub(learner_server.channel)
    unkeyed = train_request(step=1)
    unkeyed.ClearField("expected_version")
    for request in (unkeyed, train_request(step=1, expected_version=-1)):
        for _ in range(2):  # the fuzz finding: two such requests moved the learner two versions
            code = code_of(lambda r=request: stub.Train(r, timeout=TIMEOUT))
            assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "expected_version" in details_of(lambda: stub.Train(unkeyed, timeout=TIMEOUT))
    assert version_of(stub) == 0


def test_a_train_call_that_timed_out_is_retried_and_applied_once(learner_server):
    """The learner is busy past the client's deadline (its train lock held, as by a long step): the
    call fails with DEADLINE_EXCEEDED while the learner still applies it; the loop's recovery waits
    until the learner is idle and retries, which returns the stored result: version 1, not 2."""
    core = learner_server.servicer.learner
    client = LearnerClient(learner_server.server.address, timeout_s=1.0, connect_timeout_s=10)
    loop = GRPOLoop(JobConfig(), source=None, rollout=None, reward=None, learner=client, writer=None,
                    stop=threading.Event())
    held, release = threading.Event(), threading.Event()

    def long_step() -> None:
        with core._lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=long_step)
    holder.start()
    assert held.wait(10)
    threading.Timer(2.5, release.set).start()  # past the 1 s deadline
    samples = [TrainSample(prompt_ids=list(s.prompt_ids), response_ids=list(s.response_ids),
                           behaviour_logprobs=list(s.behaviour_logprobs), advantage=s.advantage,
                           generation_version=0) for s in train_request().samples]
    before = weights(core)
    try:
        started = time.monotonic()
        result = loop.recovery.train(TrainBatch(step=1, samples=samples, temperature=1.0, expected_version=0))
    finally:
        release.set()
        holder.join()
        client.close()
    assert result.policy_version == 1 and core.version == 1 and core.step == 1
    failed = [e for e in loop.recovery.events if e["event"] == "learner_failed"]
    assert failed and "DEADLINE_EXCEEDED" in failed[0]["error"], loop.recovery.events
    assert time.monotonic() - started < 30
    assert any(not torch.equal(before[n], w) for n, w in weights(core).items())  # it did train, once


def test_after_a_learner_restart_resume_is_suggested_only_when_a_checkpoint_exists(learner_server):
    """The learner restarted fresh (version 0) under a controller at version 2 with no batch to replay:
    the run cannot go on. Resuming is the advice only if the run wrote a checkpoint to resume from."""
    client = LearnerClient(learner_server.server.address, timeout_s=30, connect_timeout_s=10)
    loop = GRPOLoop(JobConfig(), source=None, rollout=None, reward=None, learner=client, writer=None,
                    stop=threading.Event())
    try:
        with pytest.raises(RlfleetError) as info:
            loop.recovery.resync(2)
        message = str(info.value)
        assert "restarted at policy version 0, the controller is at 2" in message
        assert "no checkpoint to resume from" in message, message
        assert "controller.resume=latest" not in message, message
        loop.checkpointed_step = 1
        with pytest.raises(RlfleetError, match=r"controller.resume=latest \(continues from step 1\)"):
            loop.recovery.resync(2)
    finally:
        client.close()
