"""Real gRPC reward servers that break the contract on purpose, for the client and checker tests.

`FaultyReward` is a complete `rlfleet.v1.Reward` servicer on a real server (with
health and reflection) whose behaviour a test picks: honest, slow, flaky,
returning NaN, dropping or reordering results, failing with a status, or
accepting requests it should refuse. It scores `1.0` when the response equals
the ground truth, else `0.0`, and records what it was sent.
"""
from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass, field

import grpc

from rlfleet.proto.v1 import reward_pb2, reward_pb2_grpc
from rlfleet.rpc.server import ServiceServer

SERVICE = "rlfleet.v1.Reward"


@dataclass
class Behaviour:
    delay_s: float = 0.0  # sleep before answering
    fail_first: int = 0  # the first N calls end with `fail_code`
    fail_code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE
    always_fail: grpc.StatusCode | None = None
    nan_for: str | None = None  # items whose response equals this get score NaN with ok=true
    drop_last: bool = False  # one result too few
    reverse: bool = False  # results in reverse order
    lax: bool = False  # accept duplicate / empty ids and bad extra_info_json


@dataclass
class FaultyReward(reward_pb2_grpc.RewardServicer):
    behaviour: Behaviour = field(default_factory=Behaviour)
    calls: int = 0
    batch_sizes: list[int] = field(default_factory=list)
    max_in_flight: int = 0
    _in_flight: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def Score(self, request, context):
        b = self.behaviour
        with self._lock:
            self.calls += 1
            call_number = self.calls
            self.batch_sizes.append(len(request.items))
            self._in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)
        try:
            if b.delay_s:
                _sleep_while_active(context, b.delay_s)
            if b.always_fail is not None:
                context.abort(b.always_fail, "configured to fail")
            if call_number <= b.fail_first:
                context.abort(b.fail_code, f"failing call {call_number} of the first {b.fail_first}")
            ids = [i.id for i in request.items]
            if not b.lax and (len(set(ids)) != len(ids) or "" in ids or
                              any(not _is_object(i.extra_info_json) for i in request.items)):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad request")
            results = [reward_pb2.ScoreResult(
                id=i.id, ok=True,
                score=math.nan if i.response == b.nan_for else float(i.response == i.ground_truth))
                for i in request.items]
            if b.drop_last and results:
                results = results[:-1]
            if b.reverse:
                results = results[::-1]
            return reward_pb2.ScoreResponse(results=results)
        finally:
            with self._lock:
                self._in_flight -= 1


def _sleep_while_active(context: grpc.ServicerContext, seconds: float) -> None:
    """Sleep, but end early once the caller is gone (its deadline passed, or the server stopped): a
    long delay then holds no server thread (nor the interpreter's exit) after the test is done."""
    until = time.monotonic() + seconds
    while context.is_active() and time.monotonic() < until:
        time.sleep(min(0.05, max(0.0, until - time.monotonic())))


def _is_object(text: str) -> bool:
    if not text:
        return True
    try:
        return isinstance(json.loads(text), dict)
    except json.JSONDecodeError:
        return False


class RunningFaulty:
    def __init__(self, behaviour: Behaviour | None = None, port: int = 0):
        self.servicer = FaultyReward(behaviour or Behaviour())
        self.server = ServiceServer([SERVICE], "127.0.0.1", port, max_workers=8)
        self.server.add(reward_pb2_grpc.add_RewardServicer_to_server, self.servicer)
        self.server.start()
        self.server.mark_serving()

    @property
    def address(self) -> str:
        return self.server.address

    def stop(self) -> None:
        self.server.stop(grace_s=0)
