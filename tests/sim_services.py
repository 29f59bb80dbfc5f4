"""Shared by the weight-sync and fleet tests: the real LearnerServicer with the fleet simulator's learner
behind it (bench/fleetsim/learner.py), served in-process; and a bounded wait for a condition."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.fleetsim.gpu_model import GpuModel
from bench.fleetsim.learner import SimLearner
from controller.clients import LearnerClient
from rlfleet.proto.v1 import learner_pb2_grpc
from rlfleet.rpc.server import ServiceServer
from services.learner.servicer import SERVICE_NAME, LearnerServicer


@contextmanager
def sim_learner(out_dir: Path) -> Iterator[LearnerClient]:
    """A client of a real LearnerServicer whose learner is the simulator's (no model, its weight group a
    rendezvous over sockets), served on a free local port until the block ends."""
    servicer = LearnerServicer()
    server = ServiceServer([SERVICE_NAME], "127.0.0.1", 0, max_workers=8)
    server.add(learner_pb2_grpc.add_LearnerServicer_to_server, servicer)
    server.start()
    servicer.attach(SimLearner(GpuModel(), tokens_per_s=1e6, out_dir=out_dir))
    server.mark_serving()
    client = LearnerClient(server.address, timeout_s=30)
    try:
        yield client
    finally:
        client.close()
        server.stop(grace_s=0)


def holds_within(condition: Callable[[], bool], timeout_s: float) -> bool:
    """Whether `condition` holds within `timeout_s` (polled every 50 ms; checked once more at the end)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()
