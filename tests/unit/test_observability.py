"""Metrics, log context, status and plot pieces, each on its own (no service processes)."""

from __future__ import annotations

import json
import logging
import socket
import threading

import pytest
import structlog
from prometheus_client import generate_latest

from controller.telemetry import ControllerTelemetry
from rlfleet.errors import DataError
from rlfleet.logging import set_log_fields, setup_logging
from rlfleet.metrics import ServiceMetrics
from rlfleet.app.plot import read_metrics, series
from rlfleet.app.status import collect, format_rows, prometheus_targets

pytestmark = pytest.mark.unit


@pytest.fixture
def restore_logging():
    yield
    structlog.contextvars.clear_contextvars()
    structlog.reset_defaults()
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()


def test_queue_depth_counts_work_until_done():
    m = ServiceMetrics.create("rollout")
    assert m.load_stats() == {"queue_depth": 0.0, "tokens": 0.0}
    with m.queued(3) as work:
        work.done()
        assert m.load_stats()["queue_depth"] == 2.0
        with m.queued(5):
            assert m.load_stats()["queue_depth"] == 7.0
    assert m.load_stats()["queue_depth"] == 0.0
    with pytest.raises(RuntimeError), m.queued(4):  # a failing request gives its units back too
        raise RuntimeError("boom")
    assert m.load_stats()["queue_depth"] == 0.0
    text = generate_latest(m.registry).decode()
    assert 'rlfleet_queue_depth{service="rollout"} 0.0' in text  # exported before any change


def test_controller_telemetry_exports_the_step_line():
    t = ControllerTelemetry()
    buffered = [3]
    t.watch_buffer(lambda: buffered[0])
    t.observe_step(
        {"step": 4, "policy_version": 3, "reward/mean": 0.25, "actor/pg_loss": float("nan"), "flag": True}
    )
    text = generate_latest(t.metrics.registry).decode()
    assert "rlfleet_train_step 4.0" in text
    assert 'rlfleet_policy_version{service="controller"} 3.0' in text
    assert 'rlfleet_train_metric{metric="reward/mean"} 0.25' in text
    assert 'metric="actor/pg_loss"' not in text and 'metric="flag"' not in text
    assert 'rlfleet_queue_depth{service="controller"} 3.0' in text


def test_json_log_lines_carry_run_service_and_live_fields_in_every_thread(tmp_path, restore_logging):
    log_file = tmp_path / "svc.log"
    setup_logging("rollout", "info", log_file, console=False, run="exp1")
    version = [2]
    set_log_fields(policy_version=lambda: version[0])
    log = structlog.get_logger("t")
    structlog.contextvars.bind_contextvars(step=7, request_id="abc")
    log.info("main thread")
    version[0] = 3
    worker = threading.Thread(target=lambda: log.info("other thread"))
    worker.start()
    worker.join()
    lines = [json.loads(x) for x in log_file.read_text().splitlines()]
    assert lines[0]["event"] == "main thread"
    assert {k: lines[0][k] for k in ("service", "run", "policy_version", "step", "request_id")} == {
        "service": "rollout",
        "run": "exp1",
        "policy_version": 2,
        "step": 7,
        "request_id": "abc",
    }
    # a thread sees the process-wide fields (and the version as it is now), not the main thread's request
    assert (lines[1]["service"], lines[1]["run"], lines[1]["policy_version"]) == ("rollout", "exp1", 3)
    assert "request_id" not in lines[1]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_status_of_a_stopped_run(tmp_path):
    folder = tmp_path / "run1" / "services"
    folder.mkdir(parents=True)
    port = _closed_port()
    (folder / "rollout.json").write_text(
        json.dumps({"role": "rollout", "address": f"127.0.0.1:{port}", "metrics_port": 9101, "pid": 42})
    )
    (folder / "rollout-1.json").write_text(
        json.dumps(
            {
                "role": "rollout",
                "name": "rollout-1",
                "metrics_port": 0,
                "address": f"127.0.0.1:{port}",
                "pid": 43,
            }
        )
    )
    (folder / "learner.json").write_text("{not json")
    (folder / "restarts.jsonl").write_text('{"service": "rollout-1", "attempt": 1}\n'
                                           '{"service": "rollout-1", "attempt": 2}\n{"serv')  # cut short
    rows = collect(tmp_path / "run1")
    assert [(r["role"], r["health"]) for r in rows] == [
        ("rollout", "UNREACHABLE"),
        ("rollout-1", "UNREACHABLE"),
        ("learner", "-"),
    ]
    assert "unreadable learner.json" in rows[2]["last_error"]
    table = format_rows(rows).splitlines()
    assert table[0].split()[:6] == ["role", "address", "pid", "restarts", "metrics_port", "health"]
    assert table[1].split()[:6] == ["rollout", f"127.0.0.1:{port}", "42", "0", "9101", "UNREACHABLE"]
    assert table[2].split()[:4] == ["rollout-1", f"127.0.0.1:{port}", "43", "2"]
    assert prometheus_targets(tmp_path / "run1") == [
        {"targets": ["127.0.0.1:9101"], "labels": {"name": "rollout", "run": "run1"}}
    ]
    with pytest.raises(DataError, match="has no services/ folder"):
        collect(tmp_path)


def test_plot_input_errors_and_series(tmp_path):
    with pytest.raises(DataError, match="metrics.jsonl does not exist"):
        read_metrics(tmp_path / "metrics.jsonl")
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        '{"step": 1, "reward/mean": 0.5}\n{"step": 2, "reward/mean": null}\n{"step": 3, "reward/mean": 1}\n'
    )
    assert series(read_metrics(path), "reward/mean") == ([1.0, 3.0], [0.5, 1.0])
    path.write_text('{"step": 1}\n{"reward/mean": 2}\n')
    with pytest.raises(DataError, match="line 2 has no 'step'"):
        read_metrics(path)
    path.write_text("")
    with pytest.raises(DataError, match="has no metrics yet"):
        read_metrics(path)


def test_departed_replicas_are_those_whose_last_membership_event_is_left(tmp_path):
    from controller.journal import Journal, departed_replicas

    journal = Journal(tmp_path)
    journal.record("join_accepted", replica="h:1", name="a")
    journal.record("joined", replica="h:1", name="a", version=3)
    journal.record("requeued", seq=7, reason="replica_left", replica="h:1")  # about a prompt, not membership
    journal.record("left", replica="h:1", name="a", reason="unreachable")
    journal.record("joined", replica="h:2", name="b", version=3)
    journal.record("left", replica="h:2", name="b", reason="failed")
    journal.record("join_accepted", replica="h:2", name="b")  # back again: a member
    journal.record("left", replica="h:3", name="c", reason="drained")
    journal.close()
    with open(journal.path, "a") as f:
        f.write('{"event": "left", "replica": "h:')  # cut short by a crash
    assert departed_replicas(journal.path) == {"h:1": "unreachable", "h:3": "drained"}
    assert departed_replicas(tmp_path / "nothing.jsonl") == {}
