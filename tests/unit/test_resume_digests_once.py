"""A resume reads each checkpoint's files once (issue 22): `rlfleet run` checks the digests before
it starts the learner, the learner loads without checking them again, and its ListCheckpoints does
not hash (nor warn about) the damaged newer checkpoint a second time."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import structlog.testing

import rlfleet.checkpoint_files as checkpoint_files
from controller.state import ControllerState, save_state
from rlfleet.app.launch import resolve_local_resume
from rlfleet.checkpoint_files import META, DigestChecks
from rlfleet.config import load_config
from services.learner.checkpoint import resolve_checkpoint, resumable_checkpoints
from tests.unit.test_resume_messages import _checkpoint

pytestmark = pytest.mark.unit
SOURCE = {"epoch": 0, "cursor": 0, "seed": 0, "shuffle": False, "size": 1, "order": [0]}


@pytest.fixture
def hashed(monkeypatch) -> Counter:
    """How often each checkpoint file (meta.json aside) is read for its digest."""
    counts: Counter = Counter()
    real = checkpoint_files.sha256_of

    def counting(path: Path) -> str:
        if path.name != META:
            counts[f"{path.parent.name}/{path.name}"] += 1
        return real(path)

    monkeypatch.setattr(checkpoint_files, "sha256_of", counting)
    return counts


def _run_with_a_damaged_newest(tmp_path):
    cfg = load_config(None, [f"run.output_dir={tmp_path}", "run.name=r", "controller.resume=latest"])
    for step in (2, 4):
        _checkpoint(cfg.run.dir, step)
        save_state(cfg.run.dir, ControllerState(step, step, 8 * step, SOURCE, []))
    damaged = cfg.run.dir / "checkpoints" / "step_4" / "model.safetensors"
    damaged.write_bytes(b"\xff" * damaged.stat().st_size)  # in place, same size
    return cfg


def _warnings(logs) -> list[str]:
    return [e["event"] for e in logs if e["log_level"] == "warning" and "step_4" in e["event"]]


def test_rlfleet_run_resume_reads_each_checkpoint_once(tmp_path, hashed):
    cfg = _run_with_a_damaged_newest(tmp_path)
    root = cfg.run.dir / "checkpoints"
    hashed.clear()  # the writing of the checkpoints
    with structlog.testing.capture_logs() as logs:
        verdicts = resolve_local_resume(cfg)  # the launcher, before the learner starts
        checks = DigestChecks()  # the learner process
        checks.adopt(verdicts)
        loaded = resolve_checkpoint(root, cfg.learner.resume_from, checks)
        for _ in range(2):  # ListCheckpoints, e.g. by a controller and again after its restart
            assert resumable_checkpoints(root, known_good=loaded, checks=checks) == {2: root / "step_2"}
    assert loaded == root / "step_2"
    assert hashed == Counter({"step_4/model.safetensors": 1, "step_2/model.safetensors": 1}), hashed
    assert len(_warnings(logs)) == 1, _warnings(logs)


def test_a_learner_resuming_latest_reads_each_checkpoint_once(tmp_path, hashed):
    cfg = _run_with_a_damaged_newest(tmp_path)
    root = cfg.run.dir / "checkpoints"
    hashed.clear()  # the writing of the checkpoints
    with structlog.testing.capture_logs() as logs:
        checks = DigestChecks()
        loaded = resolve_checkpoint(root, "latest", checks)  # learner.resume_from=latest
        for _ in range(2):
            assert resumable_checkpoints(root, known_good=loaded, checks=checks) == {2: root / "step_2"}
    assert hashed == Counter({"step_4/model.safetensors": 1, "step_2/model.safetensors": 1}), hashed
    assert len(_warnings(logs)) == 1, _warnings(logs)


def test_a_checkpoint_rewritten_after_its_verdict_is_read_again(tmp_path, hashed):
    cfg = _run_with_a_damaged_newest(tmp_path)
    root = cfg.run.dir / "checkpoints"
    checks = DigestChecks()
    assert resolve_checkpoint(root, "latest", checks) == root / "step_2"
    (root / "step_4" / "model.safetensors").unlink()
    (root / "step_4" / META).unlink()
    (root / "step_4").rmdir()
    _checkpoint(cfg.run.dir, 4, fill=9)  # a new, good checkpoint of step 4 (another meta.json)
    assert resumable_checkpoints(root, checks=checks) == {4: root / "step_4"}
