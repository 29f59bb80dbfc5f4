"""`controller.data_plane=flight` (issue 44): a replica pushes each group's payload to the learner's
staging store as soon as the group is generated, so a replica killed (SIGKILL) after its groups were
staged loses nothing: the step trains them from the learner's staging store, and none is re-queued as
`payload_lost` (before staging, the learner fetched them from the dead replica at Train time and the
controller re-queued them).

Deterministic order (max_staleness=0: step 2 is generated only after step 1 trained): the reward function
(tests.reward_fixtures:gated) scores step 1's items and holds every later one until the test opens its
gate, so step 2's Train cannot begin; the test waits until step 2's groups are all generated and the
replica reports them pushed to the learner, checks that the learner has not begun step 2, kills the
replica and opens the gate. (Before, the test froze the controller between a step's last group and its
Train call: a window that Score calls on the event loop made too short to hit on a loaded machine.)"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from controller.journal import audit
from rlfleet.proto.v1 import common_pb2, learner_pb2_grpc, rollout_pb2_grpc
from rlfleet.rpc.channel import open_channel
from tests.e2e.conftest import REPO, read_jsonl

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

STEPS = 5
GROUPS = 4  # prompts a step
ARGS = ("controller.max_staleness=0", f"controller.prompts_per_step={GROUPS}",
        "controller.prompts_per_request=2", "rollout.n=4", "tracking.tensorboard=false",
        "learner.checkpoint_every=1", "learner.weight_sync_timeout_s=10", "controller.service_wait_s=120",
        "run.max_restarts=2",
        f"controller.max_steps={STEPS}", "controller.data_plane=flight",
        "reward.fn=tests.reward_fixtures:gated", "reward.fn_isolation=process")
N_SAMPLES = 4  # rollout.n
HELD_STEP = 2


def _events(run: Path) -> list[dict]:
    path = run / "journal" / "prompts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _service(run: Path, role: str) -> dict:
    return json.loads((run / "services" / f"{role}.json").read_text())


def _status(run: Path, role: str) -> common_pb2.ServiceStatus:
    stub = {"rollout": rollout_pb2_grpc.RolloutStub, "learner": learner_pb2_grpc.LearnerStub}[role]
    channel = open_channel(_service(run, role)["address"])
    try:
        return stub(channel).GetStatus(common_pb2.GetStatusRequest(), timeout=10)
    finally:
        channel.close()


def _hold_a_step_staged(run: Path, gate: Path, proc: subprocess.Popen) -> None:
    """Returns once step HELD_STEP's groups are all generated and pushed to the learner, their Score
    calls held at the reward's gate, so that step's Train has not begun."""
    deadline = time.monotonic() + 240
    while len({e["seq"] for e in _events(run) if e["event"] == "generated"}) < GROUPS * HELD_STEP:
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.monotonic() < deadline, f"step {HELD_STEP}'s groups were not generated"
        time.sleep(0.01)
    generated = len({e["seq"] for e in _events(run) if e["event"] == "generated"})
    while _status(run, "rollout").stats.get("payload_pushed", 0) < generated:  # off the controller
        assert time.monotonic() < deadline, "the replica never reported its groups pushed to the learner"
        time.sleep(0.05)
    # the gate holds at least one of step HELD_STEP's items, so its Train cannot have begun (the learner's
    # in-flight count is no witness: the controller's status calls and step 1's checkpoint run beside it)
    while (gate / "calls").stat().st_size <= GROUPS * N_SAMPLES:
        assert time.monotonic() < deadline, f"no item of step {HELD_STEP} reached the reward's gate"
        time.sleep(0.05)
    learner = _status(run, "learner")
    assert not any(e["event"] == "trained" and e["step"] == HELD_STEP for e in _events(run))
    assert learner.stats["step"] == HELD_STEP - 1 and learner.stats["queue_depth"] == 0


def test_a_replica_killed_after_its_groups_were_staged_loses_none_of_them(run_dir):
    run = run_dir / "staged"
    gate = run_dir / "reward-gate"
    gate.mkdir(parents=True)
    env = {**os.environ, "RLFLEET_TEST_GATE": str(gate), "RLFLEET_TEST_GATE_FREE": str(GROUPS * N_SAMPLES)}
    proc = subprocess.Popen([sys.executable, "-m", "rlfleet.app.cli", "run", f"run.output_dir={run_dir}",
                             "run.name=staged", *ARGS], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _hold_a_step_staged(run, gate, proc)
        pid = _service(run, "rollout")["pid"]
        os.kill(pid, signal.SIGKILL)
        (gate / "open").touch()
        _, err = proc.communicate(timeout=300)
    finally:
        (gate / "open").touch()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    assert f"the rollout service (pid {pid}) was killed by signal 9 (SIGKILL)" in err, err

    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    events = _events(run)
    lost = [e for e in events if e["event"] == "requeued" and e.get("reason") == "payload_lost"]
    assert lost == []  # the dead replica's groups were staged at the learner: trained, not generated again
    step_groups = {e["seq"] for e in events if e["event"] == "trained" and e["step"] == HELD_STEP}
    assert len(step_groups) == GROUPS
    result = audit(run / "journal" / "prompts.jsonl")
    assert result.lost == [] and result.trained_twice == []
    assert sum(result.trained.values()) == STEPS * GROUPS
