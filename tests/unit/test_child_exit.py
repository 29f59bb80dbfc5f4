"""How `rlfleet run` reports a service that ended (issue 22).

A service killed -9 was reported with its last stderr line, which had nothing to do with its end
("exited with code -9: warnings.warn('resource_tracker: …"); now it says which signal ended it and
where its log is. A service that exits on its own still shows its last words.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlfleet.app.launch import Child

pytestmark = pytest.mark.unit


def _child(tmp_path: Path, code: str) -> Child:
    log = tmp_path / "rollout.stderr"
    with open(log, "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=stderr)
    return Child("rollout", proc, log)


def test_a_service_killed_by_a_signal_is_reported_as_such(tmp_path):
    child = _child(tmp_path, "import sys, time; print('Loading weights: 100%', file=sys.stderr, flush=True); "
                             "time.sleep(60)")
    deadline = time.monotonic() + 120  # an interpreter's start on a loaded machine
    while not child.stderr_path.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    child.proc.send_signal(signal.SIGKILL)
    child.proc.wait(10)
    said = child.describe_exit()
    assert f"the rollout service (pid {child.proc.pid}) was killed by signal 9 (SIGKILL)" in said, said
    assert "Loading weights" not in said, said
    assert f"its log: {child.stderr_path}" in said, said


def test_a_service_that_exits_shows_its_last_line(tmp_path):
    child = _child(tmp_path, "import sys; print('boom', file=sys.stderr); sys.exit(3)")
    child.proc.wait(20)
    said = child.describe_exit()
    assert f"the rollout service (pid {child.proc.pid}) exited with code 3: boom" in said, said
    assert str(child.stderr_path) in said, said
