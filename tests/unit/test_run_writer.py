"""The run's TensorBoard scalars (controller/outputs.py): what TensorBoard reads back from
<run>/tensorboard/."""
from __future__ import annotations

import json
import math
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from controller.outputs import RunWriter


def scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    tb = EventAccumulator(str(run_dir / "tensorboard"))
    tb.Reload()
    return {tag: [(e.step, e.value) for e in tb.Scalars(tag)] for tag in tb.Tags()["scalars"]}


def test_every_finite_number_of_a_step_is_a_scalar_at_that_step(tmp_path: Path) -> None:
    writer = RunWriter(tmp_path)
    writer.log_metrics({"step": 1, "reward/mean": 0.25, "policy_version": 0, "kl": math.nan, "note": "x"})
    writer.log_metrics({"step": 2, "reward/mean": 0.5, "policy_version": 1, "kl": 0.125, "note": "y"})
    writer.close()
    assert scalars(tmp_path) == {"reward/mean": [(1, 0.25), (2, 0.5)], "policy_version": [(1, 0.0), (2, 1.0)],
                                 "kl": [(2, 0.125)]}


def test_a_step_is_on_disk_as_soon_as_it_is_logged(tmp_path: Path) -> None:
    # a live TensorBoard shows each step as it ends, not when the queue fills or the run closes
    writer = RunWriter(tmp_path)
    writer.log_metrics({"step": 3, "reward/mean": 1.0})
    try:
        assert scalars(tmp_path) == {"reward/mean": [(3, 1.0)]}
    finally:
        writer.close()


def test_a_resumed_run_adds_a_file_and_keeps_the_earlier_steps(tmp_path: Path) -> None:
    first = RunWriter(tmp_path)
    first.log_metrics({"step": 1, "reward/mean": 0.375})
    first.close()
    second = RunWriter(tmp_path)
    second.log_metrics({"step": 2, "reward/mean": 0.625})
    second.close()
    assert scalars(tmp_path) == {"reward/mean": [(1, 0.375), (2, 0.625)]}


def test_without_tensorboard_nothing_is_written_there(tmp_path: Path) -> None:
    writer = RunWriter(tmp_path, tensorboard=False)
    writer.log_metrics({"step": 1, "reward/mean": 0.375})
    writer.close()
    assert not any((tmp_path / "tensorboard").iterdir())


def test_sample_records_are_on_disk_a_line_each_as_soon_as_they_are_logged(tmp_path: Path) -> None:
    """One write of all a step's records (issue 44), still a JSON line each and readable at once (the
    samples command and the e2e tests read the file while the run goes on)."""
    writer = RunWriter(tmp_path, tensorboard=False)
    records = [{"step": 1, "prompt": "p", "response": f"r {i}\nsecond line", "reward": 0.5 * i,
                "reward_error": None, "turns": [{"turn": 1, "text": "é"}]} for i in range(3)]
    writer.log_samples(records)
    writer.log_samples([])
    try:
        lines = (tmp_path / "samples" / "train.jsonl").read_text().splitlines()
        assert [json.loads(line) for line in lines] == records
    finally:
        writer.close()
