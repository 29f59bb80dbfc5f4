"""Where a run that no longer runs got to: its last step and when (`rlfleet status` on an ended run)."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Ended:
    """A run none of whose processes on this machine is left: where it got to, and when."""
    step: int
    max_steps: int | None
    when: float | None  # when its last step was written (metrics.jsonl), epoch seconds
    resumable: int | None = None  # the newest step controller.resume=latest can continue from

    @property
    def finished(self) -> bool:
        return self.max_steps is not None and self.step >= self.max_steps

    def describe(self, run_dir: Path) -> str:
        of = f"/{self.max_steps}" if self.max_steps is not None else ""
        at = (" on " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.when))) if self.when else ""
        if self.finished:
            return f"rlfleet: run {run_dir.name} finished: step {self.step}{of}{at}"
        stopped = f"rlfleet: run {run_dir.name} is not running: it stopped after step {self.step}{of}{at}"
        if self.resumable is None:  # a resume would fail (`nothing to resume`): say so, promise nothing
            return f"{stopped}; it has no checkpoint to resume from (a new run starts over)"
        return f"{stopped}; controller.resume=latest continues it from step {self.resumable}"

    def as_json(self) -> dict[str, Any]:
        return {"state": "finished" if self.finished else "stopped", "step": self.step,
                "max_steps": self.max_steps, "last_step_at": self.when, "resumable_step": self.resumable}


def where_it_ended(run_dir: Path) -> Ended:
    """The last step the run wrote to metrics.jsonl, when, and the steps it was to run."""
    step, when = 0, None
    metrics = run_dir / "metrics.jsonl"
    try:
        for line in metrics.read_text().splitlines():
            try:
                step = max(step, int(json.loads(line).get("step", 0)))
            except (ValueError, TypeError, AttributeError):
                continue  # a line cut short by a crash
        when = metrics.stat().st_mtime
    except OSError:
        pass
    return Ended(step, _max_steps(run_dir), when, resumable_step(run_dir))


def resumable_step(run_dir: Path) -> int | None:
    """The newest step with a learner checkpoint folder (meta.json written) and a controller state that
    loads: what controller.resume=latest would continue from (its digests are checked by the resume)."""
    from controller.state import has_state
    from rlfleet.checkpoint_files import META

    steps = [int(folder.name.removeprefix("step_")) for folder in (run_dir / "checkpoints").glob("step_*")
             if folder.name.removeprefix("step_").isdigit() and (folder / META).is_file()]
    return next((step for step in sorted(steps, reverse=True) if has_state(run_dir, step)), None)


def _max_steps(run_dir: Path) -> int | None:
    """controller.max_steps of the run's config.yaml (written by `rlfleet run`), else the default."""
    import yaml

    from rlfleet.config import ControllerConfig

    try:
        data = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
        value = (data.get("controller") or {}).get("max_steps")
        return int(value) if value is not None else ControllerConfig().max_steps
    except (OSError, ValueError, TypeError, AttributeError, yaml.YAMLError):
        return None
