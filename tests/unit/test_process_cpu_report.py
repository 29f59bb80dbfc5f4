"""tests/process_cpu: the per-process CPU log that `make test-cpu` writes, and its report."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.process_cpu.report import process_kind, render, run_logged, summarize

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("argv, kind", [
    (["/repo/rlfleet/app/cli.py", "serve", "learner", "--name"], "rlfleet serve learner"),
    (["/venv/bin/rlfleet", "run", "controller.max_steps=3"], "rlfleet run"),
    (["/repo/rlfleet/app/cli.py", "data", "arithmetic", "--output"], "rlfleet data arithmetic"),
    (["/repo/rlfleet/app/cli.py", "eval", "--model", "m"], "rlfleet eval"),
    (["-c", "/tmp/x", "0"], "python -c"),
    (["bench/step_times.py", "metrics.jsonl"], "step_times.py"),
    ([], "python"),
])
def test_process_kinds(argv, kind):
    assert process_kind(argv) == kind


def test_pytest_workers_are_their_own_kind():
    assert process_kind(["-c"], in_pytest=True) == "pytest"


def test_totals_per_kind_and_per_test_by_hand():
    lines = [
        {"argv": ["cli.py", "serve", "learner"], "cpu_s": 9.0, "test": "t.py::a", "torch": True},
        {"argv": ["cli.py", "serve", "learner"], "cpu_s": 7.0, "test": "t.py::b", "torch": True},
        {"argv": ["cli.py", "serve", "reward"], "cpu_s": 1.0, "test": "t.py::a", "torch": False},
        {"argv": ["-c"], "cpu_s": 3.0, "test": "", "torch": True, "pytest": True},
    ]
    summary = summarize(lines)
    assert summary["processes"] == 4 and summary["cpu_s"] == 20.0
    assert summary["torch_processes"] == 3 and summary["torch_cpu_s"] == 19.0
    assert summary["kinds"] == {"rlfleet serve learner": [2, 16.0, 2], "rlfleet serve reward": [1, 1.0, 0],
                                "pytest": [1, 3.0, 1]}
    assert summary["tests"] == {"t.py::a": [2, 10.0], "t.py::b": [1, 7.0]}
    text = render(summary, suite_cpu_s=40.0)
    assert "the log accounts for 50% of the run's 40 CPU-s; torch-importing processes for 48%" in text
    assert text.index("rlfleet serve learner") < text.index("pytest") < text.index("rlfleet serve reward")


def test_every_python_process_under_the_run_logs_one_line(tmp_path: Path):
    log = tmp_path / "cpu.jsonl"
    child = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'import json'], check=True)"
    rc, cpu = run_logged(log, [sys.executable, "-c", child])
    lines = [json.loads(text) for text in log.read_text().splitlines()]
    assert rc == 0 and cpu > 0
    assert len(lines) == 2 and all(line["argv"] == ["-c"] and not line["torch"] for line in lines)
    assert all(line["cpu_s"] >= 0 and line["wall_s"] >= 0 for line in lines)


def test_report_command_exits_with_the_runs_status(tmp_path: Path):
    command = [sys.executable, "-m", "tests.process_cpu.report", "--run", str(tmp_path / "l.jsonl"), "--",
               sys.executable, "-c", "raise SystemExit(3)"]
    proc = subprocess.run(command, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout.startswith("processes logged: 1,")
