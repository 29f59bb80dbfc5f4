"""Helpers of the elastic-fleet e2e tests (tests/e2e/test_fleet*.py): start `rlfleet` processes with
their output in files, wait on the run's journal, stop what a test started (by its process group)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.e2e.conftest import REPO, read_jsonl
from tests.free_ports import port_for_later

STALENESS = 1
JOB = ("controller.prompts_per_step=4", "controller.prompts_per_request=2", "rollout.n=4",
       "rollout.max_new_tokens=24", f"controller.max_staleness={STALENESS}", "tracking.tensorboard=false",
       "learner.weight_sync_timeout_s=10", "controller.service_wait_s=60", "run.threads_per_service=1")


def free_port() -> int:
    """A port for a server started later (tests/free_ports.py: one that parallel tests cannot take)."""
    return port_for_later()


def start(*args: str, log: Path) -> subprocess.Popen:
    """`rlfleet ARGS` in its own process group; stdout and stderr go to LOG.out / LOG.err."""
    return subprocess.Popen([sys.executable, "-m", "rlfleet.app.cli", *args], cwd=REPO, text=True,
                            stdout=open(log.with_suffix(".out"), "w"),  # noqa: SIM115 - the child holds it
                            stderr=open(log.with_suffix(".err"), "w"),  # noqa: SIM115
                            start_new_session=True)


def events(run: Path) -> list[dict]:
    """The run's prompt journal (membership events included) as it stands now."""
    path = run / "journal" / "prompts.jsonl"
    return read_jsonl(path) if path.exists() else []


def wait_for(what: str, check, procs: list[subprocess.Popen], timeout_s: float = 120.0):
    """Polls `check()` until it returns something true; fails at once when one of `procs` exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        for proc in procs:
            assert proc.poll() is None, f"{proc.args[3:5]} exited with {proc.returncode} before: {what}"
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for: {what}")


def stop(*procs: subprocess.Popen) -> None:
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
