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
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

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
            by_row = {prompt.index: prompt for prompt in prompts}  # prompt_index is the data set's row
            return [Dispatch(d["seed"], [(int(seq), by_row[int(i)]) for seq, i in d["members"]])
                    for d in self.requeue]
        except KeyError:
            raise CheckpointError("controller state names prompts beyond the loaded data set: resume with "
                                  "the same data files") from None


def source_state(source: PromptSource) -> dict[str, Any]:
    return {"epoch": source.epoch, "cursor": source.cursor, "seed": source.seed, "shuffle": source.shuffle,
            "size": len(source.prompts), "order": list(source._order)}


def restore_source(source: PromptSource, state: dict[str, Any]) -> None:
    if state["size"] != len(source.prompts):
        raise CheckpointError(f"the checkpoint was taken over {state['size']} prompts, "
                              f"{len(source.prompts)} are "
                              "loaded now: resume with the same data files and data.max_prompt_length")
    source.epoch, source.cursor, source.seed, source.shuffle = (state["epoch"], state["cursor"],
                                                                state["seed"],
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
        return ControllerState(int(data["step"]), int(data["policy_version"]), int(data["seq"]),
                               data["source"],
                               list(data["requeue"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"controller state {path} is unreadable or corrupt: {exc}") from None


def _step_of(path: Path) -> int | None:
    name = path.name.removeprefix("step_").removesuffix(".json")
    return int(name) if path.suffix == ".json" and name.isdigit() else None


def resume_folder(run_dir: Path, spec: str) -> Path:
    """The run folder whose controller state `controller.resume=spec` names: run_dir for `latest`,
    else the run holding the given `checkpoints/step_N` folder or `controller_state/step_N.json`."""
    given = Path(spec)
    if spec != "latest" and (given.suffix == ".json" or given.parent.name == "checkpoints"):
        return given.parent.parent
    return run_dir


def has_state(run_dir: Path, step: int) -> bool:
    """Whether run_dir holds a controller state of `step` that loads."""
    try:
        load_state(state_path(run_dir, step))
    except CheckpointError:
        return False
    return True


def resolve_resume(run_dir: Path, spec: str, learner_checkpoints: Mapping[int, str]) -> tuple[Path, str]:
    """`latest` or a `.../checkpoints/step_N` folder (or a controller_state/step_N.json) -> the
    controller state file and the learner checkpoint of that step.

    `learner_checkpoints`: the learner's checkpoints a resume can take, by step, as the learner reports
    them (LearnerClient.checkpoints: complete and passing their sha256 digests, see
    services/learner/checkpoint.resumable_checkpoints): the controller never reads the learner's files.
    `latest` is the newest step with one of them and a controller state that loads; a state file that
    does not load is passed over with a warning."""
    if spec == "latest":
        steps = sorted((s for s in (_step_of(p) for p in (run_dir / FOLDER).glob("step_*.json"))
                        if s is not None),
                       reverse=True)
        rejected: list[str] = []
        for step in steps:
            if step not in learner_checkpoints:
                continue  # no learner checkpoint of that step, or a damaged one (the learner warned)
            try:
                load_state(state_path(run_dir, step))
            except CheckpointError as exc:
                rejected.append(str(exc))
                log.warning(f"{exc}; resuming from an earlier checkpoint instead")
                continue
            return state_path(run_dir, step), learner_checkpoints[step]
        raise CheckpointError(f"nothing to resume in {run_dir}: no step with both {FOLDER}/step_N.json and "
                              f"an intact learner checkpoint step_N (the learner has steps "
                              f"{sorted(learner_checkpoints) or 'none'})"
                              + (f"; {'; '.join(rejected)}" if rejected else ""))
    given = Path(spec)
    step = _step_of(given) if given.suffix == ".json" else (
        int(given.name.removeprefix("step_")) if given.name.removeprefix("step_").isdigit() else None)
    if step is None:
        raise CheckpointError(f"controller.resume={spec!r}: expected `latest` or a checkpoints/step_N folder")
    state = state_path(resume_folder(run_dir, spec), step)
    if not state.is_file():
        raise CheckpointError(f"controller.resume={spec!r}: no controller state {state}")
    if step not in learner_checkpoints:
        raise CheckpointError(f"controller.resume={spec!r}: the learner has no complete checkpoint of "
                              f"step {step}")
    return state, learner_checkpoints[step]


def describe_resume(state: ControllerState, checkpoint: str) -> str:
    """The line a resumed run prints first."""
    return (f"rlfleet: resuming from step {state.step} (policy version {state.policy_version}, "
            f"checkpoint {checkpoint}); {sum(len(d['members']) for d in state.requeue)} prompts re-queued")


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
