"""A weight operation that waits cannot stall the service (issue 15).

The tester sent one JoinWeightGroup to an address that never answers (timeout_s=40) and then 20
PullWeights: each pull queued on a lock and held a server thread, so health and Generate
timed out for 75 s (the learner's equivalent, with PushWeights, for 40 s). Now a second weight
operation is refused at once with RESOURCE_EXHAUSTED, and health, GetStatus and Generate
answer while the first one waits.
"""
from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from grpc_health.v1 import health_pb2

from rlfleet.config import LearnerConfig, load_config
from rlfleet.errors import ConfigError
from rlfleet.proto.v1 import common_pb2, learner_pb2, rollout_pb2
from tests.service.servicer_harness import (
    PROMPTS,
    ROLES,
    Running,
    attach,
    generate,
    make_learner,
    start,
    stop,
)

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]


@pytest.fixture
def silent_address() -> Iterator[str]:
    """A port that accepts TCP connections (the kernel's backlog) but never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield f"127.0.0.1:{sock.getsockname()[1]}"


def _answers_quickly(running: Running, extra_call) -> None:
    start_time = time.monotonic()
    assert running.health() == health_pb2.HealthCheckResponse.SERVING
    stub = ROLES["rollout" if "Rollout" in running.service_name else "learner"].stub_cls(running.channel)
    assert stub.GetStatus(common_pb2.GetStatusRequest(), timeout=2).ready
    extra_call()
    assert time.monotonic() - start_time < 2.0


def _flood(call, count: int = 20) -> list[grpc.StatusCode]:
    def one(_):
        try:
            call()
        except grpc.RpcError as err:
            return err.code(), time.monotonic()
        return grpc.StatusCode.OK, time.monotonic()

    start_time = time.monotonic()
    with ThreadPoolExecutor(count) as pool:
        results = list(pool.map(one, range(count)))
    assert all(t - start_time < 3.0 for _, t in results), "refusals must come at once, not after a wait"
    return [code for code, _ in results]


def test_a_pending_join_does_not_stall_the_rollout(hf_engine, silent_address):
    running = start("rollout")
    attach("rollout", running, hf_engine)
    stub = ROLES["rollout"].stub_cls(running.channel)
    join = threading.Thread(target=lambda: pytest.raises(grpc.RpcError, stub.JoinWeightGroup,
                                                         rollout_pb2.JoinWeightGroupRequest(
                                                             address=silent_address, rank=1, world_size=2,
                                                             backend="gloo", timeout_s=40), timeout=60))
    try:
        join.start()
        time.sleep(0.5)  # the join is now waiting on the silent store
        codes = _flood(lambda: stub.PullWeights(rollout_pb2.PullWeightsRequest(version=1), timeout=60))
        assert set(codes) == {grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
        _answers_quickly(running, lambda: generate(stub, {"p0": PROMPTS["p0"]}, n=2, max_new_tokens=2))
    finally:
        stop(running)
        join.join(60)


def test_a_pending_push_does_not_stall_the_learner(tiny_model_dir, tmp_path):
    running = start("learner")
    attach("learner", running, make_learner(tiny_model_dir, LearnerConfig(lr=1e-3), tmp_path))
    stub = ROLES["learner"].stub_cls(running.channel)
    stub.OpenWeightGroup(learner_pb2.OpenWeightGroupRequest(world_size=2, timeout_s=40), timeout=10)
    push = threading.Thread(target=lambda: pytest.raises(grpc.RpcError, stub.PushWeights,
                                                         learner_pb2.PushWeightsRequest(version=0),
                                                         timeout=60))
    try:
        push.start()  # no rank ever joins: the push waits for the group's whole timeout
        time.sleep(0.5)
        codes = _flood(lambda: stub.PushWeights(learner_pb2.PushWeightsRequest(version=0), timeout=60))
        assert set(codes) == {grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
        _answers_quickly(running, lambda: None)
    finally:
        stop(running)
        push.join(60)


def test_client_timeouts_are_capped_and_the_controller_fits():
    assert load_config(None, []).limits.max_weight_timeout_s == 600
    with pytest.raises(ConfigError, match="learner.weight_sync_timeout_s .* exceeds "
                       "limits.max_weight_timeout_s"):
        load_config(None, ["learner.weight_sync_timeout_s=900"])
