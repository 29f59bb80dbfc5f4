"""Request ids and the caller's step travel with each RPC and are bound in the service's log lines;
queue depth and load reach GetStatus. A real reward servicer on an in-process gRPC server (port 0)."""

from __future__ import annotations

import json
import logging

import grpc
import pytest
import structlog

from rlfleet.logging import setup_logging
from rlfleet.proto.v1 import common_pb2, reward_pb2, reward_pb2_grpc
from rlfleet.rpc.channel import open_channel
from rlfleet.rpc.server import ServiceServer
from services.reward.scorer import RewardScorer
from services.reward.servicer import SERVICE_NAME, RewardServicer

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]


@pytest.fixture
def reward_server():
    servicer = RewardServicer()
    servicer.attach(RewardScorer("auto"))
    server = ServiceServer([SERVICE_NAME], "127.0.0.1", 0, max_workers=2)
    server.add(reward_pb2_grpc.add_RewardServicer_to_server, servicer)
    server.start()
    server.mark_serving()
    channel = open_channel(server.address)
    yield reward_pb2_grpc.RewardStub(channel)
    channel.close()
    server.stop(grace_s=0)


@pytest.fixture
def json_log(tmp_path):
    path = tmp_path / "reward.log"
    setup_logging("reward", "debug", path, console=False, run="r1")
    yield lambda: [json.loads(line) for line in path.read_text().splitlines()]
    structlog.contextvars.clear_contextvars()
    structlog.reset_defaults()
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()


def item(i: str, response: str) -> reward_pb2.ScoreItem:
    return reward_pb2.ScoreItem(
        id=i, data_source="digits_reverse", prompt="p", response=response, ground_truth="12"
    )


def test_request_id_and_step_reach_the_service_log(reward_server, json_log):
    with structlog.contextvars.bound_contextvars(request_id="req-1", step=5):
        reward_server.Score(reward_pb2.ScoreRequest(items=[item("a", "12")]), timeout=10)
    with pytest.raises(grpc.RpcError):  # the service refuses duplicate ids
        reward_server.Score(reward_pb2.ScoreRequest(items=[item("a", "1"), item("a", "2")]), timeout=10)
    lines = [ln for ln in json_log() if ln.get("rpc") == "Score"]
    done = [ln for ln in lines if ln["event"] == "rpc done"]
    assert done[0]["request_id"] == "req-1" and done[0]["step"] == 5 and done[0]["ok"] is True
    assert (done[0]["service"], done[0]["run"]) == ("reward", "r1")
    refused = [ln for ln in lines if ln["event"] == "rpc refused"]
    assert len(refused) == 1 and "duplicate item id" in refused[0]["error"]
    # no id was bound for the second call: the client made a fresh one, and no step was sent
    assert refused[0]["request_id"] not in ("", "req-1") and "step" not in refused[0]
    assert refused[0]["request_id"] == done[1]["request_id"]


def test_status_reports_load(reward_server):
    reward_server.Score(reward_pb2.ScoreRequest(items=[item("a", "12"), item("b", "21")]), timeout=10)
    st = reward_server.GetStatus(common_pb2.GetStatusRequest(), timeout=10)
    assert dict(st.stats) == {"scored": 2.0, "queue_depth": 0.0, "tokens": 0.0}
    assert st.in_flight == 0
