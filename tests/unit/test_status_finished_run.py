"""`rlfleet status` on a run that is no longer running (issue 32, from a new user's first run).

It showed every row UNREACHABLE with an empty error and exited 1 for a run that had finished; piped
to `head` it ended in a BrokenPipeError traceback. Now a run whose processes are all gone is
described in one line (finished at its last step, when; or stopped early, and how to continue it),
exit 0 when it finished; a row that does not answer says why; and a closed pipe ends it quietly.
The run folders are laid out as `rlfleet run` leaves them; the processes are real ones that exited."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlfleet.app.status import collect, print_status

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]
REPO = Path(__file__).resolve().parents[2]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _run_folder(tmp_path: Path, last_step: int, max_steps: int) -> Path:
    run = tmp_path / "runs" / "done"
    (run / "services").mkdir(parents=True)
    (run / "config.yaml").write_text(f"controller:\n  max_steps: {max_steps}\n")
    for role, port in (("controller", 1), ("rollout", 2), ("reward", 3), ("learner", 4)):
        (run / "services" / f"{role}.json").write_text(json.dumps({
            "role": role, "name": role, "address": f"127.0.0.1:{_closed_port()}", "metrics_port": 0,
            "pid": _dead_pid(), "host": os.uname().nodename, "started": time.time() - 60}))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "policy_version": s}) + "\n"
                                               for s in range(1, last_step + 1)))
    return run


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_finished_run_says_so_and_exits_0(tmp_path, capsys):
    run = _run_folder(tmp_path, last_step=30, max_steps=30)
    assert print_status(str(run)) == 0
    out = capsys.readouterr().out
    assert "finished" in out and "step 30/30" in out, out
    assert "UNREACHABLE" not in out
    assert print_status(str(run), as_json=True) == 0  # the rows as ever; the controller's says how it ended
    rows = json.loads(capsys.readouterr().out)
    [controller] = [r for r in rows if r["role"] == "controller"]
    assert controller["health"] == "FINISHED" and controller["ended"]["step"] == 30, controller


def _checkpoint(run: Path, step: int) -> None:
    """A checkpoint of `step` as the run leaves one: the learner's folder with meta.json, the controller's
    state."""
    folder = run / "checkpoints" / f"step_{step}"
    folder.mkdir(parents=True)
    (folder / "meta.json").write_text(json.dumps({"step": step, "policy_version": step, "files": {}}))
    (run / "controller_state").mkdir(exist_ok=True)
    (run / "controller_state" / f"step_{step}.json").write_text(json.dumps({
        "format": 1, "step": step, "policy_version": step, "seq": 0, "source": {}, "requeue": []}))


def test_a_run_stopped_early_says_where_and_how_to_continue(tmp_path, capsys):
    run = _run_folder(tmp_path, last_step=12, max_steps=30)
    _checkpoint(run, 12)
    assert print_status(str(run)) == 1
    out = capsys.readouterr().out
    assert "not running" in out and "step 12/30" in out and "controller.resume=latest" in out, out
    assert "continues it from step 12" in out, out


def test_a_run_stopped_without_a_checkpoint_promises_no_resume(tmp_path, capsys):
    """Issue 42, 7: an outage stopped a run before any checkpoint; status said controller.resume=latest
    continues it, and that resume failed (`nothing to resume`)."""
    run = _run_folder(tmp_path, last_step=3, max_steps=30)
    assert print_status(str(run)) == 1
    out = capsys.readouterr().out
    assert "not running" in out and "step 3/30" in out, out
    assert "controller.resume=latest continues" not in out, out
    assert "no checkpoint to resume from" in out, out


def test_a_run_that_failed_after_a_checkpoint_says_why_and_where_it_resumes(tmp_path, capsys):
    """An environment outage stops a run with an error after writing a checkpoint (issue 42, 7); `rlfleet
    run` records it as failed (issue 43). Status says why it failed and that a resume continues it: the
    merged code said only the first, and the e2e test of the outage stop (tests/e2e/test_stall.py) failed."""
    from rlfleet.app.run_end import FAILED, record_end

    run = _run_folder(tmp_path, last_step=3, max_steps=30)
    _checkpoint(run, 3)
    record_end(run, FAILED, "no environment for 3s (env.max_outage_s=3)")
    assert print_status(str(run)) == 1
    out = capsys.readouterr().out
    assert "failed after step 3/30" in out and "no environment for 3s" in out, out
    assert "controller.resume=latest continues it from step 3" in out, out
    # failed before any checkpoint (a service that did not load): no resume is promised
    (run / "checkpoints" / "step_3" / "meta.json").unlink()
    assert print_status(str(run)) == 1
    out = capsys.readouterr().out
    assert "failed after step 3/30" in out and "controller.resume=latest" not in out, out


def test_an_unreachable_row_says_why(tmp_path):
    run = _run_folder(tmp_path, last_step=3, max_steps=30)
    controller = json.loads((run / "services" / "controller.json").read_text())
    controller["pid"] = os.getpid()  # as if the controller lived: the rows are read one by one
    (run / "services" / "controller.json").write_text(json.dumps(controller))
    rows = collect(run)
    unreachable = [r for r in rows if r["health"] == "UNREACHABLE"]
    assert unreachable and all("connection refused" in r["last_error"] for r in unreachable), rows


def test_status_piped_to_head_ends_quietly(tmp_path):
    run = _run_folder(tmp_path, last_step=3, max_steps=30)
    controller = json.loads((run / "services" / "controller.json").read_text())
    controller["pid"] = os.getpid()
    (run / "services" / "controller.json").write_text(json.dumps(controller))
    # `true` has closed the pipe before status prints: as `head` does once it has its lines
    result = subprocess.run(f"{sys.executable} -m rlfleet.app.cli status {run} --json | true",
                            shell=True, cwd=REPO, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr, result.stderr
