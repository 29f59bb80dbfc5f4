"""Services started one by one, status, SIGTERM, Ctrl-C and a dying child."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import REPO, read_jsonl, rlfleet

pytestmark = pytest.mark.e2e

ROLES = ("rollout", "reward", "learner")


def _spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rlfleet.app.cli", *args], cwd=REPO,
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _announced(run: Path, role: str) -> dict | None:
    path = run / "services" / f"{role}.json"
    return json.loads(path.read_text()) if path.exists() else None


def test_services_one_by_one_then_controller_status_and_sigterm(run_dir):
    run = run_dir / "manual"
    procs = {role: _spawn("serve", role, f"run.output_dir={run_dir}", "run.name=manual") for role in ROLES}
    try:
        info = {role: _wait_for(lambda r=role: _announced(run, r), 180, f"{role} to announce")
                for role in ROLES}
        addresses = [f"{role}.address={info[role]['address']}" for role in ROLES]
        proc = rlfleet("controller", f"run.output_dir={run_dir}", "run.name=manual", "controller.max_steps=3",
                       *addresses, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert [m["step"] for m in read_jsonl(run / "metrics.jsonl")] == [1, 2, 3]

        status = rlfleet("status", str(run), timeout=60)
        for role in ROLES:
            line = next(ln for ln in status.stdout.splitlines() if ln.startswith(role))
            assert info[role]["address"] in line and "SERVING" in line, status.stdout
        # The learner and rollout both report version 3 after three steps.
        assert any(ln.startswith("learner") and " 3 " in ln
                   for ln in status.stdout.splitlines()), status.stdout

        for role, p in procs.items():
            p.send_signal(signal.SIGTERM)
        for role, p in procs.items():
            assert p.wait(timeout=30) == 0, f"{role} did not stop cleanly: {p.stderr.read()[-2000:]}"
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()


@contextlib.contextmanager
def _long_run(run_dir: Path, name: str, *extra: str) -> Iterator[tuple[subprocess.Popen, Path]]:
    """`rlfleet run` with no step limit, yielded once its first step is done; nothing outlives the test."""
    run = run_dir / name
    proc = _spawn("run", f"run.output_dir={run_dir}", f"run.name={name}",
                  "controller.max_steps=100000", *extra)
    try:
        _wait_first_step(proc, run)
        yield proc, run
    finally:
        if proc.poll() is None:
            proc.kill()
        for role in ROLES:
            info = _announced(run, role)
            if info and _pid_alive(info["pid"]):
                os.kill(info["pid"], signal.SIGKILL)


def _wait_first_step(proc: subprocess.Popen, run: Path) -> None:
    def first_step():
        if proc.poll() is not None:
            raise AssertionError(f"run ended early: {proc.stderr.read()[-2000:]}")
        path = run / "metrics.jsonl"
        return path.exists() and path.read_text().strip()
    _wait_for(first_step, 180, "the first step")


def _exit_code(proc: subprocess.Popen, timeout: float) -> int:
    """The exit code; on a hang, fails with every thread's stack (`kill -USR1`, rlfleet/app/cli.py)."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)
        time.sleep(2)
        proc.kill()
        raise AssertionError(f"still running {timeout:.0f}s later; its "
                             f"threads:\n{proc.stderr.read()[-12000:]}")


def test_ctrl_c_stops_every_service(run_dir):
    with _long_run(run_dir, "ctrlc") as (proc, run):
        pids = [_announced(run, role)["pid"] for role in ROLES]
        proc.send_signal(signal.SIGINT)
        assert _exit_code(proc, 60) == 130
        assert "interrupted (stopped by SIGINT)" in proc.stderr.read()
        _wait_for(lambda: not any(_pid_alive(p) for p in pids), 60, "services to exit")


def test_services_stop_when_the_run_is_killed(run_dir):
    """SIGKILL gives `rlfleet run` no chance to stop its services; they notice and stop themselves."""
    with _long_run(run_dir, "killed") as (proc, run):
        pids = [_announced(run, role)["pid"] for role in ROLES]
        proc.kill()
        proc.wait()
        _wait_for(lambda: not any(_pid_alive(p) for p in pids), 60, "orphaned services to exit")


def test_dead_service_stops_the_run_and_is_named(run_dir):
    # no restarts (tests/e2e/test_faults.py covers them)
    with _long_run(run_dir, "dead", "run.max_restarts=0") as (proc, run):
        victim = _announced(run, "reward")["pid"]
        others = [_announced(run, role)["pid"] for role in ("rollout", "learner")]
        os.kill(victim, signal.SIGKILL)
        assert _exit_code(proc, 90) == 2
        err = proc.stderr.read()
        named = f"reward service (pid {victim}) was killed by signal 9 (SIGKILL); its log: "
        assert named in err, err[-2000:]
        assert "Traceback" not in err
        _wait_for(lambda: not any(_pid_alive(p) for p in others), 60, "the other services to exit")
