"""A fresh `rlfleet run` in a folder holding an earlier run's outputs sets them aside, deleting nothing
(before, the new run appended its metrics to the earlier run's metrics.jsonl)."""
from __future__ import annotations

import pytest

from rlfleet.app.launch import set_aside_earlier_run

pytestmark = pytest.mark.unit


def test_an_empty_or_missing_folder_is_left_alone(tmp_path):
    assert set_aside_earlier_run(tmp_path / "none") is None
    (tmp_path / "run" / "logs").mkdir(parents=True)  # logs only: nothing a new run would mix with
    assert set_aside_earlier_run(tmp_path / "run") is None
    assert (tmp_path / "run" / "logs").is_dir()


def test_earlier_outputs_move_aside_whole_and_twice_get_two_names(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    first = set_aside_earlier_run(run)
    assert first is not None and not run.exists()
    assert (first / "metrics.jsonl").read_text() == '{"step": 1}\n' and first.name.startswith("run.")
    run.mkdir()
    (run / "checkpoints").mkdir()
    second = set_aside_earlier_run(run)
    assert second is not None and second != first and (second / "checkpoints").is_dir()
