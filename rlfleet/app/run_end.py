"""Where a run that no longer runs got to: its last step and when (`rlfleet status` on an ended run).

`rlfleet run` also records how it ended in RUN_DIR/run_end.json (finished, stopped, or failed and why)
the moment it knows, before it stops its services: status then says so at once, not rows of services
that are shutting down, and a run that failed at the start is named failed, not resumable."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


END_FILE = "run_end.json"
FINISHED, STOPPED, FAILED = "finished", "stopped", "failed"


@dataclass
class Ended:
    """A run that no longer runs (or is stopping its services): where it got to, and when."""
    step: int
    max_steps: int | None
    when: float | None  # when its last step was written (metrics.jsonl), epoch seconds
    resumable: int | None = None  # the newest step controller.resume=latest can continue from
    failure: str | None = None  # why it failed, as `rlfleet run` said it (run_end.json)

    @property
    def finished(self) -> bool:
        return self.failure is None and self.max_steps is not None and self.step >= self.max_steps

    @property
    def state(self) -> str:
        return FAILED if self.failure is not None else FINISHED if self.finished else STOPPED

    def describe(self, run_dir: Path) -> str:
        of = f"/{self.max_steps}" if self.max_steps is not None else ""
        at = (" on " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.when))) if self.when else ""
        if self.failure is not None:
            after = f"after step {self.step}{of}{at}" if self.step else "before its first step"
            failed = f"rlfleet: run {run_dir.name} failed {after}: {self.failure}"
            if self.resumable is None:  # e.g. a service that never loaded: a resume would fail the same way
                return failed
            return f"{failed}; controller.resume=latest continues it from step {self.resumable}"
        if self.finished:
            return f"rlfleet: run {run_dir.name} finished: step {self.step}{of}{at}"
        stopped = f"rlfleet: run {run_dir.name} is not running: it stopped after step {self.step}{of}{at}"
        if self.resumable is None:  # a resume would fail (`nothing to resume`): say so, promise nothing
            return f"{stopped}; it has no checkpoint to resume from (a new run starts over)"
        return f"{stopped}; controller.resume=latest continues it from step {self.resumable}"

    def as_json(self) -> dict[str, Any]:
        return {"state": self.state, "step": self.step, "max_steps": self.max_steps,
                "last_step_at": self.when, "resumable_step": self.resumable,
                **({"failure": self.failure} if self.failure is not None else {})}


def record_end(run_dir: Path, state: str, failure: str | None = None) -> None:
    """`rlfleet run`'s word on how the run ended (written atomically; `failure` with FAILED)."""
    path = run_dir / END_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{END_FILE}.tmp")
    tmp.write_text(json.dumps({"state": state, "failure": failure, "at": time.time()}) + "\n")
    tmp.replace(path)


def clear_end(run_dir: Path) -> None:
    """A run starting (or resuming) in the folder: an earlier end no longer holds."""
    (run_dir / END_FILE).unlink(missing_ok=True)


def recorded_end(run_dir: Path) -> Ended | None:
    """The end `rlfleet run` recorded, with where the run got to; None when it recorded none."""
    try:
        record = json.loads((run_dir / END_FILE).read_text())
        state = record["state"]
    except (OSError, ValueError, TypeError, KeyError):
        return None
    ended = where_it_ended(run_dir)
    if state == FAILED:
        ended.failure = str(record.get("failure") or "no reason recorded")
    return ended  # finished or stopped: as its metrics say (finished at max_steps)


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
