"""A `--join` replica still waiting for its controller stops on SIGTERM (issue 32).

The reliability re-run sent SIGTERM to `rlfleet serve rollout --join HOST:PORT` while the controller
was not there yet: the replica went on asking for controller.service_wait_s (300 s) before it
stopped. Now SIGTERM ends the wait at once: it says it stopped before joining, and exits 0."""
from __future__ import annotations

import signal
import time

import pytest

from tests.e2e.fleet_procs import JOB, free_port, start, stop, wait_for

pytestmark = [pytest.mark.e2e]


def test_sigterm_stops_a_replica_still_waiting_to_join(run_dir, tmp_path):
    controller = f"127.0.0.1:{free_port()}"  # nothing listens there
    job = (f"run.output_dir={run_dir}", *JOB, "controller.service_wait_s=300")
    replica = start("serve", "rollout", "--join", controller, *job, "run.name=early", log=tmp_path / "early")
    try:
        # serving, and asking the controller (its first "waiting" line comes ~5 s into the wait)
        wait_for("the replica waits for its controller",
                 lambda: "waiting for the controller" in (tmp_path / "early.err").read_text()
                 + (tmp_path / "early.out").read_text(), [replica], timeout_s=240)
        began = time.monotonic()
        replica.send_signal(signal.SIGTERM)
        code = replica.wait(timeout=60)
        took = time.monotonic() - began  # a second or two; ignoring SIGTERM would take the 300 s wait
    finally:
        stop(replica)
    assert code == 0, code
    assert took < 60, f"SIGTERM took {took:.1f}s to stop a replica waiting to join"
    out = (tmp_path / "early.out").read_text()
    assert "stopped before it joined" in out, out
