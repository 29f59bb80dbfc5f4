"""The reward SDK (`serve(fn)`) and the conformance check (`rlfleet reward check`).

The check must pass a server made with the SDK, and must fail each server that
breaks the contract on the check that covers that part of it.
"""
from __future__ import annotations

import math

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from rlfleet.proto.v1 import reward_pb2, reward_pb2_grpc
from rlfleet.app.reward_check import FAIL, NA, PASS, check_server, format_table
from rlfleet.app.reward_sdk import serve
from rlfleet.rpc.channel import open_channel
from tests.reward_servers import Behaviour, RunningFaulty

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]


def exact(data_source, solution_str, ground_truth, extra_info):
    if ground_truth == "boom":
        raise ValueError("cannot score this one")
    return float(solution_str.strip() == ground_truth) + float(extra_info.get("bonus", 0.0))


def score(address: str, *items: reward_pb2.ScoreItem) -> reward_pb2.ScoreResponse:
    channel = open_channel(address)
    try:
        return reward_pb2_grpc.RewardStub(channel).Score(reward_pb2.ScoreRequest(items=items), timeout=10)
    finally:
        channel.close()


def test_sdk_serves_a_function_with_health_and_reflection():
    with serve(exact, port=0, block=False) as server:
        channel = open_channel(server.address)
        try:
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            assert "rlfleet.v1.Reward" in ProtoReflectionDescriptorDatabase(channel).get_services()
        finally:
            channel.close()
        reply = score(server.address,
                      reward_pb2.ScoreItem(id="a", response="7", ground_truth="7"),
                      reward_pb2.ScoreItem(id="b", response="6", ground_truth="7",
                                           extra_info_json='{"bonus": 0.5}'),
                      reward_pb2.ScoreItem(id="c", response="7", ground_truth="boom"))
        assert [(r.id, r.ok, r.score) for r in reply.results[:2]] == [("a", True, 1.0), ("b", True, 0.5)]
        assert not reply.results[2].ok and "cannot score this one" in reply.results[2].error


def test_sdk_batched_function_and_its_mistakes():
    def batch(items):
        return [len(i.response) if i.response != "nan" else math.nan for i in items]

    with serve(batch, batched=True, block=False) as server:
        reply = score(server.address, reward_pb2.ScoreItem(id="a", response="abc"),
                      reward_pb2.ScoreItem(id="b", response="nan"))
        assert (reply.results[0].ok, reply.results[0].score) == (True, 3.0)
        assert not reply.results[1].ok and "nan" in reply.results[1].error

    with serve(lambda items: [1.0], batched=True, block=False) as server:
        with pytest.raises(grpc.RpcError) as info:
            score(server.address, reward_pb2.ScoreItem(id="a"), reward_pb2.ScoreItem(id="b"))
        assert "returned 1 values for 2 items" in info.value.details()


def test_check_passes_an_sdk_server():
    with serve("gsm8k", port=0, block=False) as server:
        checks = check_server(server.address, timeout_s=10)
    assert [c.result for c in checks] == [PASS] * len(checks), format_table("sdk", checks)
    names = {c.name for c in checks}
    assert {"health", "batch keeps order", "deadline", "malformed: duplicate ids",
            "concurrent calls"} <= names


BATCHES = {"batch keeps order", "batch = one by one", "batch of 256", "concurrent calls",
           "serves after errors"}


@pytest.mark.parametrize("behaviour, failing", [
    (Behaviour(drop_last=True), {"single item", *BATCHES}),
    (Behaviour(reverse=True), BATCHES),
    (Behaviour(nan_for="I think it is 41."), BATCHES),
    (Behaviour(lax=True), {"malformed: duplicate ids", "malformed: empty id", "malformed: extra_info_json"}),
])
def test_check_fails_servers_that_break_the_contract(behaviour, failing):
    server = RunningFaulty(behaviour)
    try:
        checks = check_server(server.address, timeout_s=5)
    finally:
        server.stop()
    table = format_table(server.address, checks)
    # "deadline" also fails a broken server, unless the 1 ms deadline passes before the reply comes.
    assert {c.name for c in checks if c.result == FAIL} - {"deadline"} == failing, table
    assert {c.name for c in checks if c.result == PASS} >= {"health", "empty batch"}
    assert "summary:" in table


def test_check_of_a_slow_server_and_an_absent_one():
    # Every Score call outlasts the checker's deadline five times over; health (no delay) has the same
    # deadline, long enough for a loaded machine.
    server = RunningFaulty(Behaviour(delay_s=5.0))
    try:
        checks = {c.name: c for c in check_server(server.address, timeout_s=1.0)}
    finally:
        server.stop()
    assert checks["health"].result == PASS
    assert checks["single item"].result == FAIL and "DEADLINE_EXCEEDED" in checks["single item"].detail
    assert checks["GetStatus (optional)"].result == NA  # the faulty servicer has no GetStatus

    absent = check_server("127.0.0.1:9", timeout_s=1)
    assert [(c.name, c.result) for c in absent] == [("health", FAIL)]
    assert "UNAVAILABLE" in absent[0].detail
