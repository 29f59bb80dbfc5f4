"""What a resume says (issue 22): a damaged controller state is warned about once, not once by
`rlfleet run` and again by its controller, and the resume names the step it continues from."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import structlog.testing

from controller.state import ControllerState, describe_resume, resolve_resume, save_state, state_path
from rlfleet.app.launch import resolve_local_resume
from rlfleet.checkpoint_files import META, file_manifest
from rlfleet.config import load_config

pytestmark = pytest.mark.unit


def _checkpoint(run: Path, step: int, fill: int | None = None) -> Path:
    """A checkpoint folder with its digests, as the learner writes it (one small file)."""
    folder = run / "checkpoints" / f"step_{step}"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(bytes([step if fill is None else fill]) * 64)
    (folder / META).write_text(json.dumps({"format": 3, "step": step, "policy_version": step,
                                           "files": file_manifest(folder)}))
    return folder


def test_a_damaged_controller_state_is_warned_about_once_and_the_step_is_named(tmp_path):
    cfg = load_config(None, [f"run.output_dir={tmp_path}", "run.name=r", "controller.resume=latest"])
    run = cfg.run.dir
    source = {"epoch": 0, "cursor": 0, "seed": 0, "shuffle": False, "size": 1, "order": [0]}
    for step in (2, 4):
        _checkpoint(run, step)
        save_state(run, ControllerState(step, step, 8 * step, source, []))
    state_path(run, 4).write_text("{")  # the newest controller state is damaged
    with structlog.testing.capture_logs() as logs:
        resolve_local_resume(cfg)  # `rlfleet run`, before the learner starts
        learner_reports = {2: cfg.learner.resume_from}  # the learner restored step 2 and lists it
        state_file, checkpoint = resolve_resume(run, cfg.controller.resume, learner_reports)  # the controller
    warnings = [e["event"] for e in logs if e["log_level"] == "warning"]
    assert len(warnings) == 1 and "step_4.json" in warnings[0], warnings
    assert (state_file, checkpoint) == (state_path(run, 2), str(run / "checkpoints" / "step_2"))
    said = describe_resume(ControllerState(2, 2, 16, source, []), checkpoint)
    assert said.startswith("rlfleet: resuming from step 2 (policy version 2") and checkpoint in said, said
