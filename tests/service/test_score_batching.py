"""Scoring batches itself naturally (issue 44): groups generated while a Score call is in flight wait
for it to return and then go out together, rather than each taking a scoring thread and a Score call
of its own (the per-call gRPC cost paid per group). Counted at a real reward servicer over real gRPC."""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import pytest

from controller.clients import RewardClient
from controller.journal import Journal
from controller.loop import GRPOLoop
from controller.outputs import RunWriter
from rlfleet.config import JobConfig
from rlfleet.data.prompts import Prompt, PromptSource
from rlfleet.proto.v1 import reward_pb2_grpc
from rlfleet.rpc.server import ServiceServer
from tests.reward_servers import SERVICE, Behaviour, FaultyReward
from tests.unit.test_admission_handoff import FleetRollout
from tests.unit.test_loop_recovery import FakeLearner, Faults, run_loop

pytestmark = [pytest.mark.service, pytest.mark.timeout(180)]

DEADLINE_S = 60.0  # generous: a loaded 2-core machine
GROUPS, N, REPLICAS = 16, 4, 8


class GatedReward(FaultyReward):
    """FaultyReward whose first Score call answers only once `release` is set."""

    def __init__(self) -> None:
        super().__init__(Behaviour())
        self.release = threading.Event()
        self.first_in = threading.Event()
        self.arrived = 0  # items received so far, the held call's included
        self.prompts: list[set[str]] = []  # each call's prompts, in arrival order

    def Score(self, request, context):
        with self._lock:
            self.arrived += len(request.items)
            self.prompts.append({item.prompt for item in request.items})
        if not self.first_in.is_set():
            self.first_in.set()
            assert self.release.wait(DEADLINE_S), "the test never released the first Score call"
        return super().Score(request, context)


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_groups_generated_while_a_score_call_is_in_flight_go_out_in_one_call(tmp_path) -> None:
    cfg = JobConfig.model_validate({
        "run": {"output_dir": str(tmp_path), "name": "batching"},
        "controller": {"prompts_per_step": GROUPS, "max_staleness": 0, "max_steps": 1,
                       "prompts_per_request": 2, "service_wait_s": 20},
        "rollout": {"n": N}})
    prompts = [Prompt(index=i, text=f"p{i}", prompt_ids=[1, 2], data_source="digits", ground_truth="1")
               for i in range(64)]
    rollouts = [FleetRollout(f"fake-rollout:{1000 + k}") for k in range(REPLICAS)]  # 8 scoring threads
    servicer = GatedReward()
    server = ServiceServer([SERVICE], "127.0.0.1", 0, max_workers=8)
    server.add(reward_pb2_grpc.add_RewardServicer_to_server, servicer)
    server.start()
    server.mark_serving()
    reward = RewardClient(server.address, timeout_s=DEADLINE_S, connect_timeout_s=10)
    loop = GRPOLoop(cfg, PromptSource(prompts, seed=0), rollouts, reward, FakeLearner(Faults()),
                    RunWriter(tmp_path, tensorboard=False), journal=Journal(tmp_path))

    def generated() -> int:  # the step's groups sent to the reward service or waiting to be
        with loop._cond:
            return servicer.arrived // N + len(loop._to_score)

    def release_once_the_burst_is_in() -> None:
        wait_for(servicer.first_in.is_set, "the first Score call")
        wait_for(lambda: generated() >= GROUPS, "the step's groups to be generated")
        servicer.release.set()

    releaser = threading.Thread(target=release_once_the_burst_is_in, daemon=True)
    releaser.start()
    try:
        assert run_loop(loop) is None
        releaser.join(DEADLINE_S)
    finally:
        servicer.release.set()
        reward.close()
        server.stop(grace_s=0)
    # The step's groups (admission goes on for the next step once it trained: those are not counted)
    journal = [json.loads(line) for line in (tmp_path / "journal" / "prompts.jsonl").read_text().splitlines()]
    step_prompts = {f"p{e['prompt_index']}" for e in journal
                    if e["event"] == "dispatched" and e["seq"] < GROUPS}
    assert len(step_prompts) == GROUPS
    calls = [prompts for prompts in servicer.prompts if prompts & step_prompts]
    assert set().union(*calls) >= step_prompts
    # the first call, then the groups that waited for it: together
    assert len(calls) <= 2, calls


class ThreadNoting(RewardClient):
    """The real reward client; notes the thread each Score call is made from."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.threads: list[str] = []

    def score(self, items):
        self.threads.append(threading.current_thread().name)
        return super().score(items)

    async def score_async(self, items):
        self.threads.append(threading.current_thread().name)
        return await super().score_async(items)


def test_groups_are_scored_on_the_event_loop_they_arrive_on_with_no_thread_hand_off(tmp_path) -> None:
    """Every Score call of the run is made on the generation side's event loop (issue 44: the thread
    hand-offs to scoring threads were ~10 % of the controller's GIL time), over real gRPC."""
    cfg = JobConfig.model_validate({
        "run": {"output_dir": str(tmp_path), "name": "on-loop"},
        "controller": {"prompts_per_step": 4, "max_staleness": 1, "max_steps": 2,
                       "prompts_per_request": 2, "service_wait_s": 20},
        "rollout": {"n": N}})
    prompts = [Prompt(index=i, text=f"p{i}", prompt_ids=[1, 2], data_source="digits", ground_truth="1")
               for i in range(32)]
    server = ServiceServer([SERVICE], "127.0.0.1", 0, max_workers=4)
    servicer = FaultyReward(Behaviour())
    server.add(reward_pb2_grpc.add_RewardServicer_to_server, servicer)
    server.start()
    server.mark_serving()
    reward = ThreadNoting(server.address, timeout_s=DEADLINE_S, connect_timeout_s=10)
    loop = GRPOLoop(cfg, PromptSource(prompts, seed=0), [FleetRollout(f"fake-rollout:{1000 + k}")
                                                          for k in range(2)],
                    reward, FakeLearner(Faults()), RunWriter(tmp_path, tensorboard=False),
                    journal=Journal(tmp_path))
    try:
        assert run_loop(loop) is None
    finally:
        reward.close()
        server.stop(grace_s=0)
    assert 0 < servicer.calls <= len(reward.threads)  # a call the stop cancelled may not have reached it
    assert set(reward.threads) == {"generation-streams"}, reward.threads
    journal = [json.loads(line) for line in (tmp_path / "journal" / "prompts.jsonl").read_text().splitlines()]
    scored = {e["seq"] for e in journal if e["event"] == "scored"}
    trained = {e["seq"] for e in journal if e["event"] == "trained"}
    assert len(trained) == 8 and trained <= scored
