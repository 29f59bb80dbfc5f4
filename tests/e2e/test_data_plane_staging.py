"""`controller.data_plane=flight` (issue 44): a replica pushes each group's payload to the learner's
staging store as soon as the group is generated, so a replica killed (SIGKILL) after its groups were
staged loses nothing: the step trains them from the learner's staging store, and none is re-queued as
`payload_lost` (before staging, the learner fetched them from the dead replica at Train time and the
controller re-queued them).

Deterministic order: once step k's groups are all generated (max_staleness=0: the replica then idles
until version k is pushed) the controller is frozen (SIGSTOP), so its Train call for step k cannot start;
the test waits until the replica reports every group it generated pushed, checks that the learner has
not begun step k, kills the replica, and lets the controller go on (SIGCONT)."""
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
        f"controller.max_steps={STEPS}", "controller.data_plane=flight")


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


def _freeze_with_a_step_staged(run: Path, proc: subprocess.Popen) -> int:
    """SIGSTOPs the controller once a step's groups are all generated and pushed to the learner, its
    Train not begun; returns the step. Should the learner have begun the step already (the freeze came
    late on a loaded machine), the controller goes on and the next step is tried."""
    deadline = time.monotonic() + 240
    for step in range(2, STEPS):
        while len({e["seq"] for e in _events(run) if e["event"] == "generated"}) < GROUPS * step:
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() < deadline, f"step {step}'s groups were not generated"
            time.sleep(0.002)
        os.kill(proc.pid, signal.SIGSTOP)
        generated = len({e["seq"] for e in _events(run) if e["event"] == "generated"})
        while _status(run, "rollout").stats.get("payload_pushed", 0) < generated:  # off the controller
            assert time.monotonic() < deadline, "the replica never reported its groups pushed to the learner"
            time.sleep(0.05)
        learner = _status(run, "learner")
        trained = any(e["event"] == "trained" and e["step"] == step for e in _events(run))
        if not trained and learner.in_flight <= 0 and learner.stats["step"] == step - 1:
            return step
        os.kill(proc.pid, signal.SIGCONT)
    raise AssertionError("every step's Train began before the controller could be frozen")


def test_a_replica_killed_after_its_groups_were_staged_loses_none_of_them(run_dir):
    run = run_dir / "staged"
    proc = subprocess.Popen([sys.executable, "-m", "rlfleet.app.cli", "run", f"run.output_dir={run_dir}",
                             "run.name=staged", *ARGS], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    frozen = False
    try:
        step = _freeze_with_a_step_staged(run, proc)
        frozen = True
        pid = _service(run, "rollout")["pid"]
        os.kill(pid, signal.SIGKILL)
        os.kill(proc.pid, signal.SIGCONT)
        frozen = False
        _, err = proc.communicate(timeout=300)
    finally:
        if frozen:
            os.kill(proc.pid, signal.SIGCONT)
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
    step_groups = {e["seq"] for e in events if e["event"] == "trained" and e["step"] == step}
    assert len(step_groups) == GROUPS
    result = audit(run / "journal" / "prompts.jsonl")
    assert result.lost == [] and result.trained_twice == []
    assert sum(result.trained.values()) == STEPS * GROUPS
