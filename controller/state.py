"""The controller's part of a checkpoint: data cursor, groups not yet trained, step and version.

Saved as `<run_dir>/controller_state/step_N.json` (temp file, then rename) right after the
learner saved `checkpoints/step_N`, so a state file always has its learner checkpoint. Groups
in flight or buffered at that moment are not saved as data: their prompts, admission numbers
and sampling seeds are, and a resumed run dispatches them again first, in the same requests.
Under `controller.max_staleness=0` with seeded sampling that regenerates exactly what the
uninterrupted run generated, so the loss trajectory is reproduced bit for bit.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from rlfleet.checkpoint_files import META, verify_folder
from rlfleet.data.prompts import Prompt, PromptSource
from rlfleet.errors import CheckpointError

log = structlog.get_logger(__name__)

FOLDER = "controller_state"
FORMAT = 1


@dataclass
class Dispatch:
    """One Generate request: its sampling seed and its prompts with their admission numbers."""

    seed: int | None
    members: list[tuple[int, Prompt]] = field(default_factory=list)

    def request_ids(self) -> dict[str, tuple[int, Prompt]]:
        return {f"p{prompt.index}-s{seq}": (seq, prompt) for seq, prompt in self.members}


def sampling_seed(run_seed: int, seq: int) -> int:
    """The seed of the request whose first prompt was admitted `seq`-th: a function of the run's
    seed and that number only, so a re-dispatched request samples the same tokens."""
    return (run_seed * 1_000_003 + seq * 7919 + 1) % (1 << 62)


@dataclass
class ControllerState:
    step: int
    policy_version: int
    seq: int
    source: dict[str, Any]
    requeue: list[dict[str, Any]]  # [{seed, members: [[seq, prompt_index], …]}] in dispatch order

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "step": self.step, "policy_version": self.policy_version,
                           "seq": self.seq, "source": self.source, "requeue": self.requeue})

    def dispatches(self, prompts: list[Prompt]) -> list[Dispatch]:
        try:
            return [Dispatch(d["seed"], [(int(seq), prompts[int(i)]) for seq, i in d["members"]])
                    for d in self.requeue]
        except IndexError:
            raise CheckpointError("controller state names prompts beyond the loaded data set: resume with "
                                  "the same data files") from None


def source_state(source: PromptSource) -> dict[str, Any]:
    return {"epoch": source.epoch, "cursor": source.cursor, "seed": source.seed, "shuffle": source.shuffle,
            "size": len(source.prompts), "order": list(source._order)}


def restore_source(source: PromptSource, state: dict[str, Any]) -> None:
    if state["size"] != len(source.prompts):
        raise CheckpointError(f"the checkpoint was taken over {state['size']} prompts, {len(source.prompts)} are "
                              "loaded now: resume with the same data files and data.max_prompt_length")
    source.epoch, source.cursor, source.seed, source.shuffle = (state["epoch"], state["cursor"], state["seed"],
                                                                state["shuffle"])
    source._order = list(state["order"])


def state_path(run_dir: Path, step: int) -> Path:
    return run_dir / FOLDER / f"step_{step}.json"


def save_state(run_dir: Path, state: ControllerState) -> Path:
    path = state_path(run_dir, state.step)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as fh:
        fh.write(state.to_json())
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path


def load_state(path: Path) -> ControllerState:
    try:
        data = json.loads(path.read_text())
        return ControllerState(int(data["step"]), int(data["policy_version"]), int(data["seq"]), data["source"],
                               list(data["requeue"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"controller state {path} is unreadable or corrupt: {exc}") from None


def _step_of(path: Path) -> int | None:
    name = path.name.removeprefix("step_").removesuffix(".json")
    return int(name) if path.suffix == ".json" and name.isdigit() else None


def resolve_resume(run_dir: Path, spec: str) -> tuple[Path, Path]:
    """`latest` or a `.../checkpoints/step_N` folder (or a controller_state/step_N.json) -> the
    controller state file and the learner checkpoint folder of that step, both complete and intact.
    `latest` is the newest step whose two parts pass their checks (the learner's files against
    their sha256); a damaged newer one is passed over with a warning naming the bad file."""
    checkpoints = run_dir / "checkpoints"
    if spec == "latest":
        steps = sorted((s for s in (_step_of(p) for p in (run_dir / FOLDER).glob("step_*.json")) if s is not None),
                       reverse=True)
        rejected: list[str] = []
        for step in steps:
            if not (checkpoints / f"step_{step}" / META).is_file():
                continue  # its learner checkpoint was never completed: not a checkpoint
            try:
                verify_folder(checkpoints / f"step_{step}")
                load_state(state_path(run_dir, step))
            except CheckpointError as exc:
                rejected.append(str(exc))
                log.warning(f"{exc}; resuming from an earlier checkpoint instead")
                continue
            return state_path(run_dir, step), checkpoints / f"step_{step}"
        raise CheckpointError(f"nothing to resume in {run_dir}: no step with both {FOLDER}/step_N.json and "
                              f"checkpoints/step_N/{META}" + (" intact (" + "; ".join(rejected) + ")"
                                                              if rejected else ""))
    given = Path(spec)
    step = _step_of(given) if given.suffix == ".json" else (
        int(given.name.removeprefix("step_")) if given.name.removeprefix("step_").isdigit() else None)
    if step is None:
        raise CheckpointError(f"controller.resume={spec!r}: expected `latest` or a checkpoints/step_N folder")
    base = given.parent.parent if given.suffix == ".json" or given.parent.name == "checkpoints" else run_dir
    state, ckpt = state_path(base, step), base / "checkpoints" / f"step_{step}"
    if not state.is_file():
        raise CheckpointError(f"controller.resume={spec!r}: no controller state {state}")
    if not (ckpt / META).is_file():
        raise CheckpointError(f"controller.resume={spec!r}: learner checkpoint {ckpt} is missing or incomplete")
    verify_folder(ckpt)
    return state, ckpt


def truncate_jsonl(path: Path, last_step: int) -> int:
    """Drops lines of steps after `last_step` (written after the checkpoint a run resumes from);
    returns how many were dropped."""
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            step = json.loads(line).get("step", 0)
        except json.JSONDecodeError:  # a line cut by the crash
            dropped += 1
            continue
        if isinstance(step, (int, float)) and step > last_step:
            dropped += 1
        else:
            kept.append(line)
    if dropped:
        tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, path)
    return dropped
