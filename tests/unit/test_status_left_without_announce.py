"""A replica that left, and that announced nowhere in the run's folder, still gets its `LEFT` row
(issue 32).

A replica started by hand (on another machine, or under another run.name) announces in its own run
folder, not the run's: when it left, `rlfleet status RUN_DIR` showed no row for it, though the README
says replicas that left are shown `LEFT`. The controller knows who left and why; status now lists
them from its answer. A real controller status server over a Fleet."""
from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from controller.fleet import Fleet
from controller.status_servicer import start_status_server
from rlfleet.app.status import LEFT, collect
from rlfleet.models.identity import identity_of
from tests.unit.test_fleet_first_group import ARCH, JoiningRollout

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def test_a_replica_that_left_without_an_announce_file_here_is_listed_left(tmp_path):
    fleet = Fleet([], architecture=ARCH, connect=lambda address: JoiningRollout(address))
    member = fleet.join("10.1.2.3:50051", "by-hand", identity_of(ARCH))
    fleet.remove(member, "sigterm")
    server = start_status_server("127.0.0.1", 0, "run", {}, lambda: SimpleNamespace(
        fleet=fleet, _rollout_version=0, step=3, last_metrics={}, buffered=lambda: 0))
    run = tmp_path / "run"
    (run / "services").mkdir(parents=True)
    (run / "services" / "controller.json").write_text(json.dumps({
        "role": "controller", "name": "controller", "address": server.address, "metrics_port": 0,
        "pid": os.getpid(), "host": os.uname().nodename}))
    try:
        rows = collect(run)
    finally:
        server.stop(grace_s=0)
    [left] = [r for r in rows if r["address"] == "10.1.2.3:50051"]
    assert left["health"] == LEFT and left["fleet"] == "left: sigterm", left


def test_with_the_controller_gone_the_journal_names_who_left(tmp_path):
    from controller.journal import Journal

    run = tmp_path / "run"
    (run / "services").mkdir(parents=True)
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{sock.getsockname()[1]}"
    (run / "services" / "controller.json").write_text(json.dumps({
        "role": "controller", "name": "controller", "address": closed, "metrics_port": 0,
        "pid": os.getpid(), "host": os.uname().nodename}))
    journal = Journal(run)
    journal.record("joined", replica="10.1.2.3:50051", name="by-hand", version=0)
    journal.record("left", replica="10.1.2.3:50051", name="by-hand", reason="drained")
    journal.close()
    rows = collect(run)
    [left] = [r for r in rows if r["address"] == "10.1.2.3:50051"]
    assert left["health"] == LEFT and left["fleet"] == "left: drained", left
