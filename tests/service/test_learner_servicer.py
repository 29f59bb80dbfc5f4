"""The learner servicer on a real in-process gRPC server, also fed the rollout's logprobs.

Servers bind 127.0.0.1 port 0 (the OS picks the port) and are stopped in teardown.
The rollout and learner load the session's tiny random model (tests/conftest.py).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import grpc
import pytest
import torch

from rlfleet.proto.v1 import (
    common_pb2,
    learner_pb2,
    learner_pb2_grpc,
    rollout_pb2_grpc,
)
from tests.service.servicer_harness import (
    TIMEOUT,
    code_of,
    details_of,
    generate,
)

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]


def train_request(step: int = 1, expected_version: int = 0, logprobs: list[float] | None = None
                  ) -> learner_pb2.TrainRequest:
    samples = [
        learner_pb2.TrainSample(prompt_ids=[6, 7, 41, 8, 45], response_ids=[9, 2],
                                behaviour_logprobs=logprobs if logprobs is not None else [-4.0, -4.2],
                                advantage=1.0, generation_version=0),
        learner_pb2.TrainSample(prompt_ids=[6, 7, 41, 8, 45], response_ids=[10, 11, 2],
                                behaviour_logprobs=[-4.1, -4.0, -4.3], advantage=-1.0, generation_version=0),
        learner_pb2.TrainSample(prompt_ids=[15, 16], response_ids=[20, 21, 22, 2],
                                behaviour_logprobs=[-4.0] * 4, advantage=0.5, generation_version=0),
    ]
    return learner_pb2.TrainRequest(step=step, samples=samples, temperature=1.0,
                                    expected_version=expected_version)


def test_learner_train_step(learner_server):
    stub = learner_pb2_grpc.LearnerStub(learner_server.channel)
    before = {n: p.detach().clone() for n, p in learner_server.servicer.learner.model.named_parameters()}
    reply = stub.Train(train_request(step=1, expected_version=0), timeout=TIMEOUT)
    assert reply.policy_version == 1
    for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "actor/kl_loss", "actor/lr"):
        assert key in reply.metrics, key
        assert math.isfinite(reply.metrics[key]), key
    assert reply.metrics["actor/grad_norm"] > 0
    assert reply.metrics["actor/entropy"] > 0
    assert reply.metrics["learner/tokens"] == 9
    # micro_batch_tokens=16 splits the 3 samples (lengths 7, 8, 6) into several micro-batches.
    assert reply.metrics["learner/micro_batches"] >= 2
    after = dict(learner_server.servicer.learner.model.named_parameters())
    assert any(not torch.equal(before[n], after[n]) for n in before)  # the optimizer stepped

    reply = stub.Train(train_request(step=2, expected_version=1), timeout=TIMEOUT)
    assert reply.policy_version == 2
    status = stub.GetStatus(common_pb2.GetStatusRequest(), timeout=TIMEOUT)
    assert status.ready and status.policy_version == 2 and status.stats["step"] == 2


def test_learner_version_mismatch(learner_server):
    stub = learner_pb2_grpc.LearnerStub(learner_server.channel)
    assert code_of(lambda: stub.Train(train_request(expected_version=3), timeout=TIMEOUT)) \
        == grpc.StatusCode.FAILED_PRECONDITION
    assert "expected policy version 3" in details_of(
        lambda: stub.Train(train_request(expected_version=3), timeout=TIMEOUT))
    # The refused step did not count.
    assert stub.Train(train_request(expected_version=0), timeout=TIMEOUT).policy_version == 1


def test_learner_rejects_bad_samples(learner_server):
    stub = learner_pb2_grpc.LearnerStub(learner_server.channel)
    mismatched = train_request(logprobs=[-1.0])  # 1 logprob for 2 response tokens
    assert code_of(lambda: stub.Train(mismatched, timeout=TIMEOUT)) == grpc.StatusCode.INVALID_ARGUMENT
    assert "behaviour_logprobs" in details_of(lambda: stub.Train(mismatched, timeout=TIMEOUT))
    empty = learner_pb2.TrainRequest(step=1, expected_version=-1)
    assert code_of(lambda: stub.Train(empty, timeout=TIMEOUT)) == grpc.StatusCode.INVALID_ARGUMENT
    too_long = learner_pb2.TrainRequest(step=1, expected_version=0, samples=[learner_pb2.TrainSample(
        prompt_ids=[5] * 120, response_ids=[6] * 10, behaviour_logprobs=[-1.0] * 10, advantage=1.0)])
    assert code_of(lambda: stub.Train(too_long, timeout=TIMEOUT)) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert stub.GetStatus(common_pb2.GetStatusRequest(), timeout=TIMEOUT).policy_version == 0


def test_learner_save_checkpoint(learner_server, tmp_path):
    stub = learner_pb2_grpc.LearnerStub(learner_server.channel)
    stub.Train(train_request(step=1, expected_version=0), timeout=TIMEOUT)
    path = Path(stub.SaveCheckpoint(learner_pb2.SaveCheckpointRequest(step=1), timeout=TIMEOUT).path)
    assert path.is_dir() and path.name == "step_1"
    for name in ("config.json", "model.safetensors", "optimizer.pt", "meta.json"):
        assert (path / name).is_file(), name
    meta = json.loads((path / "meta.json").read_text())
    assert meta["step"] == 1 and meta["policy_version"] == 1
    assert not list(path.parent.glob("*.tmp-*"))  # nothing half-written left behind


def test_learner_lists_its_checkpoints_for_a_resuming_controller(learner_server, tmp_path):
    """The controller asks the learner which checkpoints a run can resume from (it never reads the
    learner's files): complete ones only, plus the one the learner started from."""
    from controller.clients import LearnerClient

    stub = learner_pb2_grpc.LearnerStub(learner_server.channel)
    assert list(stub.ListCheckpoints(learner_pb2.ListCheckpointsRequest(), timeout=TIMEOUT).checkpoints) == []
    first = stub.SaveCheckpoint(learner_pb2.SaveCheckpointRequest(step=1), timeout=TIMEOUT).path
    (Path(first).parent / "step_5").mkdir()  # a save that never completed: no meta.json
    reply = stub.ListCheckpoints(learner_pb2.ListCheckpointsRequest(), timeout=TIMEOUT)
    assert [(c.step, c.path) for c in reply.checkpoints] == [(1, first)]
    assert not reply.HasField("restored_from")
    other_run = tmp_path / "other" / "step_3"  # the learner was started from another run's checkpoint
    other_run.mkdir(parents=True)
    (other_run / "meta.json").write_text(json.dumps({"step": 3}))
    learner_server.servicer.attach(learner_server.servicer.learner, restored_from=other_run)
    client = LearnerClient(learner_server.server.address, timeout_s=TIMEOUT, connect_timeout_s=TIMEOUT)
    try:
        assert client.checkpoints() == {1: first, 3: str(other_run)}
    finally:
        client.close()


def test_learner_leaves_a_damaged_checkpoint_out_of_the_list(learner_server):
    """controller.resume=latest takes the newest checkpoint that passes its sha256 digests: one
    damaged in place (same size) is not offered, the one before it is."""
    stub = learner_pb2_grpc.LearnerStub(learner_server.channel)
    first = stub.SaveCheckpoint(learner_pb2.SaveCheckpointRequest(step=1), timeout=TIMEOUT).path
    newest = Path(stub.SaveCheckpoint(learner_pb2.SaveCheckpointRequest(step=2), timeout=TIMEOUT).path)
    with open(newest / "model.safetensors", "r+b") as fh:
        fh.seek(fh.seek(0, 2) // 2)
        fh.write(b"\xff" * 64)
    reply = stub.ListCheckpoints(learner_pb2.ListCheckpointsRequest(), timeout=TIMEOUT)
    assert [(c.step, c.path) for c in reply.checkpoints] == [(1, first)]


def test_rollout_logprobs_agree_with_learner(rollout_server, learner_server):
    """Same weights on both sides: the learner's logprobs of a rollout's samples equal the
    behaviour logprobs, so the first step is on-policy (importance ratio 1)."""
    rollout = rollout_pb2_grpc.RolloutStub(rollout_server.channel)
    prompts = {"a": [6, 7, 41, 8, 45], "b": [15, 16]}
    groups = generate(rollout, prompts, n=2, temperature=1.0, max_new_tokens=5, seed=4)
    samples = [learner_pb2.TrainSample(prompt_ids=prompts[g.request_id], response_ids=c.token_ids,
                                       behaviour_logprobs=c.logprobs, advantage=1.0 if i % 2 else -1.0,
                                       generation_version=c.policy_version)
               for g in groups for i, c in enumerate(g.completions)]
    learner = learner_pb2_grpc.LearnerStub(learner_server.channel)
    reply = learner.Train(learner_pb2.TrainRequest(step=1, samples=samples, temperature=1.0,
                                                   expected_version=0),
                          timeout=TIMEOUT)
    assert reply.metrics["rollout/logprob_diff_mean"] < 1e-3
    # the training-inference mismatch reaches the reply (and so metrics.jsonl, TensorBoard, Prometheus)
    assert reply.metrics["mismatch/abs_logprob_diff_mean"] == reply.metrics["rollout/logprob_diff_mean"]
    assert 0.0 <= reply.metrics["mismatch/kl"] < 1e-3
    assert reply.metrics["mismatch/abs_logprob_diff_max"] >= reply.metrics["mismatch/abs_logprob_diff_mean"]
    assert reply.metrics["mismatch/ratio_over_2"] == 0.0
    assert reply.metrics["actor/pg_clipfrac"] == 0.0


# ---- (e) reflection and (f) status ---------------------------------------------------------------


def test_a_train_request_sent_as_its_groups_bytes_trains_as_the_message_does(learner_server):
    """LearnerClient.train sends a batch with its groups' request bytes (controller/train_parts.py) as
    they are: the learner trains it, and the same step sent again as a message is the same request (the
    stored result comes back, nothing trained twice)."""
    from controller.clients import LearnerClient
    from controller.train_parts import EncodedTrainBatch
    from rlfleet import types as t
    from rlfleet.rpc import convert

    samples = convert.train_batch_from_proto(train_request()).samples
    parts = (convert.train_samples_wire(samples[:2]), convert.train_samples_wire(samples[2:]))
    batch = EncodedTrainBatch(step=1, samples=samples, temperature=1.0, expected_version=0, sample_wire=parts)
    client = LearnerClient(learner_server.server.address, timeout_s=TIMEOUT, connect_timeout_s=TIMEOUT)
    try:
        result = client.train(batch)
        assert result.policy_version == 1 and result.metrics["learner/tokens"] == 9
        again = client.train(t.TrainBatch(step=1, samples=samples, temperature=1.0, expected_version=0))
        assert again == result
    finally:
        client.close()
    assert learner_server.servicer.learner.step == 1
