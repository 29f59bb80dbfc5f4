"""The reward servicer on a real in-process gRPC server.

Servers bind 127.0.0.1 port 0 (the OS picks the port) and are stopped in teardown.
The rollout and learner load the session's tiny random model (tests/conftest.py).
"""
from __future__ import annotations

import json

import grpc
import pytest
from grpc_health.v1 import health_pb2

from rlfleet.proto.v1 import (
    common_pb2,
    reward_pb2,
    reward_pb2_grpc,
)
from tests.service.servicer_harness import (
    TIMEOUT,
    code_of,
    details_of,
)

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]


def item(i: str, response: str, truth: str, source: str = "custom", extra: dict | None = None,
         extra_json: str | None = None) -> reward_pb2.ScoreItem:
    return reward_pb2.ScoreItem(id=i, data_source=source, prompt="p", response=response, ground_truth=truth,
                                extra_info_json=extra_json if extra_json is not None else
                                (json.dumps(extra) if extra else ""))


def test_reward_scores_one_result_per_item(reward_server):
    stub = reward_pb2_grpc.RewardStub(reward_server.channel)
    reply = stub.Score(reward_pb2.ScoreRequest(items=[
        item("a", "42", "42"), item("b", "41", "42"), item("c", " 7 ", "7", extra={"bonus": 0.5}),
        item("d", "x", "dict")]), timeout=TIMEOUT)
    assert [r.id for r in reply.results] == ["a", "b", "c", "d"]
    assert [r.ok for r in reply.results] == [True] * 4
    assert [r.score for r in reply.results] == pytest.approx([1.0, 0.0, 1.5, 0.25])
    assert all(r.error == "" for r in reply.results)


def test_reward_failures_are_reported_not_scored_zero(reward_server):
    stub = reward_pb2_grpc.RewardStub(reward_server.channel)
    reply = stub.Score(reward_pb2.ScoreRequest(items=[
        item("ok", "1", "1"), item("boom", "1", "raise"), item("nan", "1", "nan"), item("inf", "1", "inf")]),
        timeout=TIMEOUT)
    by_id = {r.id: r for r in reply.results}
    assert by_id["ok"].ok and by_id["ok"].score == 1.0
    for bad in ("boom", "nan", "inf"):
        assert not by_id[bad].ok, bad
        assert by_id[bad].error, bad
    assert "exploded" in by_id["boom"].error and "ValueError" in by_id["boom"].error
    assert "nan" in by_id["nan"].error.lower()


def test_reward_bad_requests_and_recovery(reward_server, auto_reward_server):
    stub = reward_pb2_grpc.RewardStub(reward_server.channel)
    not_json = reward_pb2.ScoreRequest(items=[item("a", "1", "1", extra_json="{not json")])
    assert code_of(lambda: stub.Score(not_json, timeout=TIMEOUT)) == grpc.StatusCode.INVALID_ARGUMENT
    assert "extra_info_json" in details_of(lambda: stub.Score(not_json, timeout=TIMEOUT))
    not_object = reward_pb2.ScoreRequest(items=[item("a", "1", "1", extra_json="[1, 2]")])
    assert code_of(lambda: stub.Score(not_object, timeout=TIMEOUT)) == grpc.StatusCode.INVALID_ARGUMENT
    duplicate = reward_pb2.ScoreRequest(items=[item("a", "1", "1"), item("a", "2", "2")])
    assert code_of(lambda: stub.Score(duplicate, timeout=TIMEOUT)) == grpc.StatusCode.INVALID_ARGUMENT

    auto = reward_pb2_grpc.RewardStub(auto_reward_server.channel)
    unknown = reward_pb2.ScoreRequest(items=[item("a", "1", "1", source="no/such_source")])
    assert code_of(lambda: auto.Score(unknown, timeout=TIMEOUT)) == grpc.StatusCode.INVALID_ARGUMENT
    assert "no/such_source" in details_of(lambda: auto.Score(unknown, timeout=TIMEOUT))

    # Both servers still answer, and remember the last error for GetStatus.
    reply = stub.Score(reward_pb2.ScoreRequest(items=[item("z", "3", "3")]), timeout=TIMEOUT)
    assert reply.results[0].ok and reply.results[0].score == 1.0
    status = stub.GetStatus(common_pb2.GetStatusRequest(), timeout=TIMEOUT)
    assert status.ready and "InvalidRequest" in status.last_error
    assert auto.GetStatus(common_pb2.GetStatusRequest(), timeout=TIMEOUT).ready
    assert auto_reward_server.health() == health_pb2.HealthCheckResponse.SERVING


def test_reward_empty_request(reward_server):
    stub = reward_pb2_grpc.RewardStub(reward_server.channel)
    assert list(stub.Score(reward_pb2.ScoreRequest(), timeout=TIMEOUT).results) == []


# ---- (c) rollout --------------------------------------------------------------------------------


def test_a_hanging_and_a_crashing_item_fail_alone_and_the_service_keeps_serving():
    from services.reward.isolation import IsolatedScorer
    from tests.service.servicer_harness import attach, start, stop

    running = start("reward")
    scorer = IsolatedScorer("tests.reward_fixtures:hang_or_crash", workers=2, item_timeout_s=3.0)
    attach("reward", running, scorer)
    try:
        stub = reward_pb2_grpc.RewardStub(running.channel)
        request = reward_pb2.ScoreRequest(items=[item("a", "1", "1"), item("h", "x", "hang"),
                                                 item("c", "x", "crash"), item("b", "2", "1")])
        reply = stub.Score(request, timeout=60)
        by_id = {r.id: r for r in reply.results}
        assert by_id["a"].ok and by_id["a"].score == 1.0 and by_id["b"].ok and by_id["b"].score == 0.0
        assert not by_id["h"].ok and "no reward within 3s" in by_id["h"].error
        assert not by_id["c"].ok and "died" in by_id["c"].error
        again = stub.Score(reward_pb2.ScoreRequest(items=[item("d", "7", "7")]), timeout=60)
        assert again.results[0].ok and again.results[0].score == 1.0  # the service keeps serving
    finally:
        scorer.close()
        stop(running)


def test_finish_reason_reaches_the_rule_over_grpc_and_through_the_worker_pool(auto_reward_server):
    """A response cut at the budget ('length') is never credited by the arithmetic rule: the finish reason
    travels in the request (ScoreItem.finish_reason) to the function; absent, the response counts as
    finished (servers and callers that do not know it)."""
    stub = reward_pb2_grpc.RewardStub(auto_reward_server.channel)
    items = [reward_pb2.ScoreItem(id=i, data_source="rlfleet/arithmetic", response="2 + 3 = 5",
                                  ground_truth="5", finish_reason=reason)
             for i, reason in (("stop", "stop"), ("cut", "length"), ("unknown", ""))]
    reply = stub.Score(reward_pb2.ScoreRequest(items=items), timeout=TIMEOUT)
    assert [(r.id, r.score) for r in reply.results] == [("stop", 1.0), ("cut", 0.0), ("unknown", 1.0)]

    from rlfleet.types import ScoreItem
    from services.reward.isolation import IsolatedScorer

    pool = IsolatedScorer("auto", workers=1, item_timeout_s=30)  # what the reward service scores with
    try:
        results = pool.score([ScoreItem("a", "rlfleet/arithmetic", "p", "5", "5", finish_reason="length"),
                              ScoreItem("b", "rlfleet/arithmetic", "p", "5", "5", finish_reason="stop")])
    finally:
        pool.close()
    assert [r.score for r in results] == [0.0, 1.0]
