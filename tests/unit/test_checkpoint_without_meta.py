"""A step folder without meta.json is reported when a resume passes over it (issue 32).

The reliability re-run left `checkpoints/step_N/` without its meta.json (copied by hand, or a copy
cut short): a `latest` resume went back to the previous checkpoint without a word. Now it says which
folder it passed over and why. Folders are written with the checkpoint's own meta format
(rlfleet.checkpoint_files)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import structlog.testing

from rlfleet.checkpoint_files import META, file_manifest
from services.learner.checkpoint import resolve_checkpoint

pytestmark = [pytest.mark.unit]


def _complete(root: Path, step: int) -> Path:
    folder = root / f"step_{step}"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"weights" * 10)
    (folder / META).write_text(json.dumps({"step": step, "policy_version": step,
                                           "files": file_manifest(folder)}))
    return folder


def test_a_newer_step_folder_without_meta_is_named_when_latest_passes_over_it(tmp_path):
    good = _complete(tmp_path, 2)
    bare = tmp_path / "step_5"
    bare.mkdir()
    (bare / "model.safetensors").write_bytes(b"half a copy")
    with structlog.testing.capture_logs() as logs:
        assert resolve_checkpoint(tmp_path, "latest") == good
    warned = [e["event"] for e in logs if e["log_level"] == "warning"]
    assert any("step_5" in w and META in w for w in warned), logs


def test_a_temporary_folder_of_a_checkpoint_being_written_is_not_reported(tmp_path):
    good = _complete(tmp_path, 2)
    (tmp_path / "step_3.tmp-1234").mkdir()  # being written (or left by a crash: removed at start)
    with structlog.testing.capture_logs() as logs:
        assert resolve_checkpoint(tmp_path, "latest") == good
    assert not [e for e in logs if e["log_level"] == "warning"], logs


def test_rlfleet_runs_resume_latest_names_a_step_folder_without_meta_too(tmp_path):
    """Issue 42, 8: `rlfleet run … controller.resume=latest` resolves the checkpoint in the launcher
    (rlfleet/app/launch.py), which passed over a step folder without meta.json silently; the warning
    lived only in resolve_checkpoint's `latest` branch. Both go through one function now."""
    from controller.state import ControllerState, save_state
    from rlfleet.app.launch import local_learner_checkpoints

    good = _complete(tmp_path / "checkpoints", 2)
    save_state(tmp_path, ControllerState(2, 2, 0, {}, []))
    bare = tmp_path / "checkpoints" / "step_5"
    bare.mkdir()
    (bare / "model.safetensors").write_bytes(b"half a copy")
    with structlog.testing.capture_logs() as logs:
        assert local_learner_checkpoints(tmp_path, "latest") == {2: str(good)}
    warned = [e["event"] for e in logs if e["log_level"] == "warning"]
    assert any("step_5" in w and META in w for w in warned), logs
