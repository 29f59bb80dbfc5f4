"""`rlfleet serve ROLE` says where it serves (issue 32, from a new user): it printed nothing on the
terminal, unlike `rlfleet reward serve` and `rlfleet env serve`. Now it prints
"serving on HOST:PORT" once it serves, and SIGTERM stops it."""
from __future__ import annotations

import re
import signal

import pytest

from tests.e2e.fleet_procs import start, stop, wait_for

pytestmark = [pytest.mark.e2e]


def test_serve_prints_where_it_serves(run_dir, tmp_path):
    service = start("serve", "reward", f"run.output_dir={run_dir}", "run.name=by-hand",
                    log=tmp_path / "reward")
    try:
        line = wait_for("the serving line", lambda: re.search(
            r"rlfleet reward service: serving on (127\.0\.0\.1:\d+)", (tmp_path / "reward.out").read_text()),
            [service], timeout_s=120)
        service.send_signal(signal.SIGTERM)
        assert service.wait(timeout=60) == 0
    finally:
        stop(service)
    assert int(line.group(1).rsplit(":", 1)[1]) > 0
