"""`rlfleet status RUN_DIR` after a joiner that announced in the run's folder was killed -9: the run is
healthy, so status exits 0; the replica the controller recorded as left is shown `LEFT`, and an
announce file whose process is gone and that the controller does not list is shown `STALE`."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.e2e.conftest import REPO, read_jsonl
from tests.e2e.fleet_procs import JOB, events, free_port, start, stop, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _status(run, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlfleet.app.cli", "status", str(run), *extra], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_status_after_a_joiner_was_killed_shows_it_left_and_exits_0(run_dir, tmp_path):
    port = free_port()
    controller = f"127.0.0.1:{port}"
    run = run_dir / "fleet"
    job = (f"run.output_dir={run_dir}", "run.name=fleet", *JOB)  # the joiner announces in the run's folder
    main = start("run", *job, f"controller.port={port}", "controller.max_steps=100000", log=tmp_path / "run")
    procs = [main]
    try:
        # `rlfleet run` clears services/ as it starts: the joiner comes once the controller announced
        wait_for("the controller announced", (run / "services" / "controller.json").is_file, procs)
        joiner = start("serve", "rollout", "--join", controller, *job, log=tmp_path / "joiner")
        procs.append(joiner)
        announced = wait_for("the joiner announced", lambda: [
            p for p in (run / "services").glob("rollout-*.json") if json.loads(p.read_text())["pid"]
            == joiner.pid], procs)
        address = json.loads(announced[0].read_text())["address"]
        wait_for("the joiner generated", lambda: any(
            e["event"] == "generated" and e.get("replica") == address for e in events(run)), procs)
        # what a replica killed before it ever joined leaves: its process gone, unknown to the controller
        ghost = run / "services" / "rollout-gone-1.json"
        ghost.write_text(json.dumps({"role": "rollout", "name": "rollout-gone-1", "pid": _dead_pid(),
                                     "address": f"127.0.0.1:{free_port()}", "metrics_port": 0}))
        os.kill(joiner.pid, signal.SIGKILL)
        joiner.wait()
        wait_for("the controller noticed", lambda: any(
            e["event"] == "left" and e["replica"] == address for e in events(run)), [main], timeout_s=60)
        # and trained a step without it (the weight group re-formed): the run is healthy again
        wait_for("a step after the leave", lambda: any(
            m["fleet/leaves"] == 1 for m in read_jsonl(run / "metrics.jsonl")), [main], timeout_s=60)

        status = _status(run, "--json")
        rows = {r["role"]: r for r in json.loads(status.stdout)}
        assert status.returncode == 0, status.stdout + status.stderr
        left = next(r for r in rows.values() if r["address"] == address)
        assert left["health"] == "LEFT" and left["fleet"] in ("left: failed", "left: unreachable"), left
        assert rows["rollout-gone-1"]["health"] == "STALE", rows["rollout-gone-1"]
        assert "gone" in rows["rollout-gone-1"]["last_error"], rows["rollout-gone-1"]
        assert {r["health"] for name, r in rows.items() if r is not left and name != "rollout-gone-1"} \
            == {"SERVING"}, rows
        table = _status(run).stdout.splitlines()
        assert any(line.split()[5:6] == ["STALE"] for line in table if line.startswith("rollout-gone-1"))

        main.send_signal(signal.SIGINT)
        main.wait(timeout=120)  # stopped by Ctrl-C: 130
        # with the controller gone, the journal still says the joiner left; the run is down: exit 1
        status = _status(run, "--json")
        assert status.returncode == 1
        rows = {r["address"]: r for r in json.loads(status.stdout)}
        row = rows[address]
        assert row["health"] == "LEFT" and row["fleet"].startswith("left: "), row
    finally:
        stop(*procs)
