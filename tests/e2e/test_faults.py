"""Fault tolerance: kill -9 the rollout, the reward or the learner mid-run (one at a time).

`rlfleet run` restarts the dead service (bounded, with backoff, on the same port; the
learner from its newest checkpoint), the controller waits, re-queues and retries, the weight
group is rebuilt, and the run completes. The journal proves no prompt was lost or trained twice.
"""
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
from tests.e2e.conftest import REPO, read_jsonl

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

STEPS = 7
ARGS = ("controller.max_staleness=0", "controller.prompts_per_step=4", "controller.prompts_per_request=2",
        "rollout.n=4", "tracking.tensorboard=false", "learner.checkpoint_every=1",
        "learner.weight_sync_timeout_s=10", "controller.service_wait_s=120", "run.max_restarts=2",
        f"controller.max_steps={STEPS}")


def _last_event(run: Path) -> str:
    lines = (run / "journal" / "prompts.jsonl").read_text().splitlines()
    return json.loads(lines[-1])["event"] if lines else ""


def _steps_done(run: Path) -> int:
    path = run / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def _events(run: Path) -> list[dict]:
    path = run / "journal" / "prompts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _cut_off(events: list[dict], killed_at: float) -> set[int]:
    """Groups in flight when the rollout was killed: dispatched before the kill, and what followed their
    last dispatch was no reply but a requeue after the kill (or nothing)."""
    cut = set()
    for seq in {e["seq"] for e in events if e["event"] == "dispatched" and e["t"] <= killed_at}:
        mine = [e for e in events if e.get("seq") == seq and e["event"] in ("dispatched", "generated",
                                                                            "requeued")]
        last = max(i for i, e in enumerate(mine) if e["event"] == "dispatched" and e["t"] <= killed_at)
        after = mine[last + 1] if last + 1 < len(mine) else None
        if after is None or (after["event"] == "requeued" and after["t"] >= killed_at):
            cut.add(seq)
    return cut


def _freeze_rollout_before_a_push(run: Path, proc: subprocess.Popen) -> int:
    """SIGSTOPs the rollout once step k's groups are all generated and none trained yet.

    With max_staleness=0 the rollout then idles until version k is pushed to it, so the push that
    follows step k's training is certain to find it frozen. Should the poll see step k trained
    already (a loaded machine), it lets the rollout go and tries the next step."""
    deadline = time.monotonic() + 180
    for step in range(2, STEPS):
        while len({e["seq"] for e in _events(run) if e["event"] == "generated"}) < 4 * step:
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() < deadline, f"step {step}'s groups were not generated"
            time.sleep(0.002)
        pid = json.loads((run / "services" / "rollout.json").read_text())["pid"]
        os.kill(pid, signal.SIGSTOP)
        if not any(e["event"] == "trained" and e["step"] == step for e in _events(run)):
            return pid
        os.kill(pid, signal.SIGCONT)
    raise AssertionError("every step was trained before the rollout could be frozen")


# flight (issue 44): a killed rollout takes its groups' tokens along (re-queued `payload_lost` if a
# step needed them); a killed learner's replayed step fetches them again (held until a checkpoint).
@pytest.mark.parametrize("victim, plane", [("rollout", "inline"), ("reward", "inline"), ("learner", "inline"),
                                           ("rollout", "flight"), ("learner", "flight")])
def test_run_survives_a_killed_service(run_dir, victim, plane):
    run = run_dir / victim
    # The rollout is killed while it generates (longer responses make that window wide).
    extra = ("rollout.max_new_tokens=48",) if victim == "rollout" else ()
    extra = (*extra, f"controller.data_plane={plane}")
    proc = subprocess.Popen([sys.executable, "-m", "rlfleet.app.cli", "run", f"run.output_dir={run_dir}",
                             f"run.name={victim}", *ARGS, *extra], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while _steps_done(run) < 2:
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "the run did not reach step 2"
            time.sleep(0.1)
        while victim == "rollout" and _last_event(run) != "dispatched":
            assert time.monotonic() < deadline, "no generation in flight seen"
            time.sleep(0.005)
        pid = json.loads((run / "services" / f"{victim}.json").read_text())["pid"]
        killed_at = time.time()
        os.kill(pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    assert f"the {victim} service (pid {pid}) was killed by signal 9 (SIGKILL)" in err, err
    assert "restarting it (1/2)" in err, err
    [restart] = read_jsonl(run / "services" / "restarts.jsonl")
    assert restart["service"] == victim and restart["pid"] == pid

    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    assert [m["policy_version"] for m in metrics] == list(range(STEPS))  # no step lost or repeated
    events = read_jsonl(run / "journal" / "prompts.jsonl")
    kinds = {e["event"] for e in events}
    if victim in ("rollout", "learner"):  # the restarted side lost the group: it was rebuilt
        assert "weight_group_rebuilt" in kinds, sorted(kinds)
    if victim == "rollout":  # the prompts it was generating went back to the queue and were trained later
        failed = [e for e in events if e["event"] == "requeued" and e["reason"] == "rollout_failed"]
        # what the kill cut off: groups dispatched before it whose reply did not come next (the kill can
        # land as the last reply is already on its way; then nothing was cut off, and nothing lost is
        # checked below either way)
        cut = _cut_off(events, killed_at)
        assert cut <= {e["seq"] for e in failed}, (cut, failed)
        for e in failed:
            later = events[events.index(e):]
            assert any(x["event"] == "dispatched" and x["seq"] == e["seq"] for x in later)
            assert any(x["event"] == "trained" and x["seq"] == e["seq"] for x in later)
    result = audit(run / "journal" / "prompts.jsonl")
    assert result.lost == [], result.lost
    assert result.trained_twice == [], result.trained_twice
    assert sum(result.trained.values()) == STEPS * 4
    # Every dispatched prompt was trained, dropped with a reason, or is in flight at the end.
    stopped = {e["seq"] for e in events if e["event"] == "requeued" and e["reason"] == "stopped"}
    assert result.dispatched == set(result.trained) | set(result.dropped) | stopped
    assert all(result.dropped.values())
    # The final checkpoint is the learner's step STEPS, at version STEPS.
    meta = json.loads((run / "checkpoints" / f"step_{STEPS}" / "meta.json").read_text())
    assert meta["policy_version"] == STEPS


def test_weight_push_to_a_stalled_rollout_aborts_and_the_group_is_rebuilt(run_dir):
    """The rollout freezes (SIGSTOP) as a step's weights are about to be pushed: the push times out
    (learner.weight_sync_timeout_s) and aborts, the controller rebuilds the group once the replica
    answers again (SIGCONT) and pushes the version again; the run completes, nothing lost."""
    run = run_dir / "stall"
    proc = subprocess.Popen([sys.executable, "-m", "rlfleet.app.cli", "run", f"run.output_dir={run_dir}",
                             "run.name=stall", *ARGS, "learner.weight_sync_timeout_s=5"], cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    pid = None
    try:
        pid = _freeze_rollout_before_a_push(run, proc)
        deadline = time.monotonic() + 60  # thawed once the push timed out (5 s) and the run recorded it
        while not any(e["event"] == "weight_sync_failed" for e in _events(run)):
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "the push to the frozen rollout never failed"
            time.sleep(0.05)
        os.kill(pid, signal.SIGCONT)
        _, err = proc.communicate(timeout=300)
    finally:
        if pid is not None:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    assert not (run / "services" / "restarts.jsonl").exists()  # nothing died: same processes throughout
    events = read_jsonl(run / "journal" / "prompts.jsonl")
    failed = [e for e in events if e["event"] == "weight_sync_failed"]
    rebuilt = [e for e in events if e["event"] == "weight_group_rebuilt"]
    assert failed and rebuilt, sorted({e["event"] for e in events})
    assert rebuilt[0]["version"] == failed[0]["version"]  # the same version pushed again
    assert [m["step"] for m in read_jsonl(run / "metrics.jsonl")] == list(range(1, STEPS + 1))
    result = audit(run / "journal" / "prompts.jsonl")
    assert result.lost == [] and result.trained_twice == []
