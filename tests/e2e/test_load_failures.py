"""A service that fails while loading for a reason a restart would repeat is not restarted: the run
ends in seconds with the service's own one-line error. Other deaths are restarted, and the final
error says the restarts were spent."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlfleet.app.launch import Child
from rlfleet.app.supervisor import Supervisor
from rlfleet.rpc.service_main import LOAD_FAILED_EXIT, load_error_path
from tests.e2e.conftest import rlfleet

pytestmark = pytest.mark.e2e


def _damaged_checkpoint(folder: Path) -> Path:
    """A checkpoint whose meta.json says model.safetensors has 10 bytes; it has 5."""
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"x" * 5)
    (folder / "meta.json").write_text(json.dumps({"format": 3, "step": 1, "policy_version": 1, "files": {
        "model.safetensors": {"size": 10, "sha256": "0" * 64}}}))
    return folder


@pytest.mark.parametrize("case", ["unknown reward.fn", "damaged checkpoint"])
def test_a_load_failure_ends_the_run_in_seconds_with_the_services_own_error(run_dir, tmp_path, case):
    if case == "unknown reward.fn":
        args, role = ["reward.fn=nonexistent"], "reward"
        expected = "ConfigError: reward function 'nonexistent'"
    else:
        checkpoint = _damaged_checkpoint(tmp_path / "ckpt" / "step_1")
        args, role = [f"learner.resume_from={checkpoint}"], "learner"
        expected = (f"CheckpointError: checkpoint {checkpoint} is corrupt: model.safetensors has 5 "
                    "bytes")
    started = time.monotonic()
    proc = rlfleet("run", f"run.output_dir={run_dir}", "run.name=badload", "controller.max_steps=2", *args,
                   timeout=180)
    elapsed = time.monotonic() - started
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"rlfleet: error: the {role} service (pid "), proc.stderr[-3000:]
    assert f"failed while loading: {expected}" in last, last
    assert "not restarted: it failed while loading" in last, last
    assert "restarting it" not in proc.stderr and "Traceback" not in last
    assert not (run_dir / "badload" / "services" / "restarts.jsonl").exists()
    # Measured: 10 s on an idle 2-core machine, 30 s with four other jobs on it. Three restarts with
    # backoff (48-65 s on top of one such start) is what this replaced: the lines above rule them out;
    # this bound rules out waiting for the failed service (controller.service_wait_s, 300 s).
    assert elapsed < 120, f"{elapsed:.0f}s"
    print(f"{case}: ended after {elapsed:.1f}s")


def _child(tmp_path: Path, code: str) -> Child:
    """A real process that runs `code` and exits; restarting it runs `code` again (`serve` marks the
    role in the command line, as in `rlfleet serve ROLE`, for the supervisor's restart)."""
    cmd = [sys.executable, "-c", code, "serve", "toy"]
    stderr = tmp_path / "logs" / "toy.stderr"
    stderr.parent.mkdir(parents=True, exist_ok=True)
    with open(stderr, "w") as fh:
        proc = subprocess.Popen(cmd, stderr=fh)
    proc.wait()
    return Child("toy", proc, stderr, cmd=cmd, run_dir=tmp_path)


def _until_final(supervisor: Supervisor, child: Child, timeout_s: float = 30.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if child.proc.poll() is not None:
            failure = supervisor.handle(child)
            if failure is not None:
                return failure
        time.sleep(0.05)
    raise AssertionError("the supervisor never gave up")


def test_a_crashing_service_is_restarted_then_the_error_says_the_restarts_were_spent(tmp_path):
    child = _child(tmp_path, "import sys; print('boom', file=sys.stderr); sys.exit(3)")
    failure = _until_final(Supervisor(max_restarts=2, run_dir=tmp_path, backoff_s=0.01), child)
    assert "exited with code 3: boom" in failure
    assert failure.endswith("; restarts spent 2/2 (run.max_restarts)")
    assert len((tmp_path / "services" / "restarts.jsonl").read_text().splitlines()) == 2
    failure = _until_final(Supervisor(max_restarts=0, run_dir=tmp_path),
                           _child(tmp_path, "raise SystemExit(3)"))
    assert failure.endswith("; not restarted (run.max_restarts=0)")


def test_a_service_that_wrote_its_load_error_is_not_restarted(tmp_path):
    record = load_error_path(tmp_path, "toy")
    code = (f"import pathlib, sys; p = pathlib.Path({str(record)!r}); p.parent.mkdir(parents=True, "
            "exist_ok=True); p.write_text('ConfigError: reward.fn: no such function\\n'); "
            "print('some unrelated last line', file=sys.stderr); "
            f"sys.exit({LOAD_FAILED_EXIT})")
    failure = _until_final(Supervisor(max_restarts=3, run_dir=tmp_path, backoff_s=0.01),
                           _child(tmp_path, code))
    assert "failed while loading: ConfigError: reward.fn: no such function" in failure
    assert "unrelated" not in failure and failure.endswith("not restarted: it failed while loading, which a "
                                                           "restart would repeat")
    assert not (tmp_path / "services" / "restarts.jsonl").exists()
