"""Checkpoints in HF format plus everything a resumed run needs, written atomically.

A checkpoint folder `step_N/` holds the model (HF format; only the adapters under LoRA),
the tokenizer, `optimizer.pt`, `trainer_state.pt` (RNG states of python, numpy and torch,
the critic's weights and optimizer when PPO trains one, an LR scheduler's state if any)
and `meta.json` (step, policy version, and the size of every file). It is built in
`step_N.tmp-<pid>` and renamed to `step_N` only when complete, with `meta.json` written
last, so a half-written one is never picked (and the next learner to start removes it if its writer
is gone: remove_stale_temporaries). `meta.json` records each file's size and sha256
(rlfleet/checkpoint_files.py); loading checks both, so a missing, truncated or damaged file is
a CheckpointError naming it, and `latest`/`auto` take the newest checkpoint that passes,
warning about each newer one passed over.
"""
from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import structlog
import torch

from rlfleet.checkpoint_files import (META, DigestChecks, file_manifest, first_good, read_meta,
                                     verify_folder)
from rlfleet.errors import CheckpointError

log = structlog.get_logger(__name__)

__all__ = ["META", "read_meta"]  # re-exported: callers find a checkpoint's names here
OPTIMIZER = "optimizer.pt"
TRAINER_STATE = "trainer_state.pt"
FORMAT = 3  # 3: files carry a sha256 besides their size


def rng_state() -> dict[str, Any]:
    # numpy's key array travels as a tensor, so the file loads with torch.load(weights_only=True)
    name, keys, pos, has_gauss, cached = np.random.get_state()
    numpy_state = (name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached))
    state = {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.int64).astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def remove_stale_temporaries(root: Path) -> list[Path]:
    """Removes the `step_N.tmp-<pid>` folders of learners that died while saving (a real model's
    weights and optimizer each); returns them. This process's own and those of a process still
    alive are left alone: only one learner writes a run's checkpoints, but a pid is only known gone
    when no process has it."""
    removed: list[Path] = []
    if not root.is_dir():
        return removed
    for tmp in sorted(root.glob("step_*.tmp-*")):
        pid = tmp.name.rpartition(".tmp-")[2]
        if not pid.isdigit() or int(pid) <= 0 or int(pid) == os.getpid() or _pid_alive(int(pid)):
            continue
        shutil.rmtree(tmp, ignore_errors=True)
        removed.append(tmp)
    return removed


def save_checkpoint(root: Path, step: int, model: torch.nn.Module, tokenizer: Any,
                    optimizer: torch.optim.Optimizer, meta: dict[str, Any], critic: Any = None,
                    scheduler: Any = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step}"
    tmp = root / f"step_{step}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    model.save_pretrained(tmp, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    torch.save(optimizer.state_dict(), tmp / OPTIMIZER)
    trainer: dict[str, Any] = {"rng": rng_state()}
    if critic is not None:
        trainer["critic"] = {"model": critic.model.state_dict(), "optimizer": critic.optimizer.state_dict()}
    if scheduler is not None:
        trainer["scheduler"] = scheduler.state_dict()
    torch.save(trainer, tmp / TRAINER_STATE)
    files = file_manifest(tmp)
    for name in files:  # the data is on disk before meta.json says the checkpoint is complete
        with open(tmp / name, "rb") as fh:
            os.fsync(fh.fileno())
    (tmp / META).write_text(json.dumps({"format": FORMAT, "step": step, **meta, "files": files}, indent=2))
    _fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(root)
    return final


def complete_checkpoints(root: Path) -> dict[int, Path]:
    """Every complete step_N folder under root (one with meta.json), by step."""
    found = {}
    for child in root.glob("step_*"):
        suffix = child.name.removeprefix("step_")
        if suffix.isdigit() and (child / META).is_file():
            found[int(suffix)] = child
    return found


def incomplete_checkpoints(root: Path) -> dict[int, Path]:
    """step_N folders under root without meta.json (a copy cut short, a folder made by hand), by step.
    A checkpoint being written is in step_N.tmp-<pid>, never among these."""
    return {int(child.name.removeprefix("step_")): child for child in root.glob("step_*")
            if child.name.removeprefix("step_").isdigit() and not (child / META).is_file()}


def _report_incomplete(root: Path, chosen: Path | None) -> None:
    """Says which newer step folders a resume passed over for want of meta.json (issue 32: silently)."""
    newest = int(chosen.name.removeprefix("step_")) if chosen is not None else -1
    for step, folder in sorted(incomplete_checkpoints(root).items()):
        if step > newest:
            log.warning(f"checkpoint folder {folder} has no {META} (incomplete: a copy cut short or a folder "
                        f"not written by the learner); passing over it to the previous checkpoint")


def newest_first(root: Path) -> list[Path]:
    """The complete step_N folders under root, newest first."""
    found = complete_checkpoints(root)
    return [found[step] for step in sorted(found, reverse=True)]


def latest_checkpoint(root: Path) -> Path | None:
    """The highest complete step_N folder (one with meta.json), or None. Its content is not checked."""
    found = newest_first(root)
    return found[0] if found else None


def resumable_checkpoints(root: Path, wanted: Callable[[int], bool] = lambda step: True,
                          known_good: Path | None = None, checks: DigestChecks | None = None,
                          report_incomplete: bool = True, rejected: list[str] | None = None
                          ) -> dict[int, Path]:
    """The checkpoints under root that a `latest` resume can take, by step: walking the complete ones
    newest first, each is checked against its digests (a damaged one is passed over with a warning
    naming the bad file) until the first intact one whose step is `wanted`. Older ones are not read:
    hashing a large model's checkpoint takes a minute, and a resume takes the newest that is whole.
    `known_good`: a folder already checked (the one the learner restored from), not read again;
    `checks`: the process's verdicts of before, reused (a damaged folder is not read nor warned about
    again). `report_incomplete`: warn about each newer step folder without meta.json passed over (the
    one place this is said, for the learner's `latest` and the launcher's resume alike; issue 42);
    `rejected`: where to add why each damaged folder was passed over."""
    found: dict[int, Path] = {}
    taken: Path | None = None
    for folder in newest_first(root):
        if known_good is None or folder.resolve() != known_good.resolve():
            good, why = first_good([folder], checks=checks)
            if rejected is not None:
                rejected.extend(why)
            if good is None:
                continue
        step = int(folder.name.removeprefix("step_"))
        found[step] = taken = folder
        if wanted(step):
            break
    if report_incomplete:
        _report_incomplete(root, taken)
    return found


def resolve_checkpoint(root: Path, spec: str | None, checks: DigestChecks | None = None) -> Path | None:
    """`latest` -> the newest checkpoint under root whose files match their digests, passing over
    damaged newer ones with a warning (CheckpointError if there is none); `auto` -> the same, or None
    when root holds no checkpoint at all; a path -> that folder (it must be complete and pass the same
    check); None/"" -> None. A returned folder has been verified: restore it with verified=True.
    `checks`: where the verdicts are kept (and reused) for this process."""
    if not spec:
        return None
    if spec in ("latest", "auto"):
        candidates = newest_first(root)
        if not candidates:
            if spec == "auto":
                return None
            bare = ", ".join(f.name for _, f in sorted(incomplete_checkpoints(root).items()))
            raise CheckpointError(f"no complete checkpoint under {root} to resume from"
                                  + (f" ({bare}: no {META})" if bare else ""))
        rejected: list[str] = []
        found = resumable_checkpoints(root, checks=checks, rejected=rejected)
        if not found:  # starting fresh would silently throw the run's progress away
            raise CheckpointError(f"no usable checkpoint under {root}: {'; '.join(rejected)}")
        return next(iter(found.values()))
    path = Path(spec)
    if not (path / META).is_file():
        raise CheckpointError(f"checkpoint {path} is missing or incomplete (no {META})")
    (checks.verify if checks is not None else verify_folder)(path)
    return path


def verify_checkpoint(path: Path) -> dict[str, Any]:
    """meta.json, after checking every file it lists is there with its recorded size and sha256."""
    return verify_folder(path)


def _first_line(exc: BaseException) -> str:
    """torch and safetensors explain a damaged file over many lines; an error here is one line."""
    return next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)


def _load(path: Path, what: str) -> Any:
    try:
        # weights_only: a checkpoint folder may come from elsewhere; never unpickle arbitrary objects.
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises several types for a damaged file
        raise CheckpointError(f"checkpoint {path.parent} is corrupt: cannot read {what} ({path.name}): "
                              f"{_first_line(exc)}") from None


def _load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except Exception as exc:  # noqa: BLE001
        raise CheckpointError(f"checkpoint {path.parent} is corrupt: cannot read {path.name}: "
                              f"{_first_line(exc)}") from None


def _load_model_weights(path: Path, model: torch.nn.Module) -> None:
    from services.learner.lora import is_lora

    if is_lora(model):
        from peft import set_peft_model_state_dict

        adapter = path / "adapter_model.safetensors"
        if not adapter.is_file():
            raise CheckpointError(f"checkpoint {path} has no LoRA adapters (adapter_model.safetensors), but "
                                  "learner.lora.rank > 0")
        result = set_peft_model_state_dict(model, _load_safetensors(adapter))
        if getattr(result, "unexpected_keys", None):
            raise CheckpointError(f"checkpoint {path}: adapters do not match the model "
                                  f"({result.unexpected_keys[:3]} …)")
        return
    shards = sorted(p for p in path.glob("*.safetensors") if not p.name.startswith("adapter_"))
    if not shards:
        raise CheckpointError(f"checkpoint {path} has no model weights (*.safetensors)")
    state: dict[str, torch.Tensor] = {}
    for shard in shards:
        state.update(_load_safetensors(shard))
    missing, unexpected = model.load_state_dict(state, strict=False)
    # save_pretrained leaves out tied weights (the output embedding under tie_word_embeddings).
    tied = getattr(model.config, "tie_word_embeddings", False)
    missing = [k for k in missing if not (tied and k.startswith("lm_head."))]
    if missing or unexpected:
        raise CheckpointError(f"checkpoint {path} does not match the model: missing {missing[:3]}, "
                              f"unexpected {unexpected[:3]}")


def restore_learner(learner: Any, path: Path, verified: bool = False) -> dict[str, Any]:
    """Loads a checkpoint into a freshly built Learner: weights (or adapters), optimizer, critic,
    LR scheduler, RNG states, step and policy version. Returns the checkpoint's meta.
    `verified`: resolve_checkpoint already checked the files' digests (reading them all once more
    costs a minute on a 7B model's checkpoint)."""
    meta = read_meta(path) if verified else verify_checkpoint(path)
    with learner._lock:
        _load_model_weights(path, learner.model)
        try:
            learner.optimizer.load_state_dict(_load(path / OPTIMIZER, "the optimizer state"))
        except (ValueError, KeyError) as exc:
            raise CheckpointError(f"checkpoint {path}: optimizer state does not fit this "
                                  f"model: {exc}") from None
        trainer = _load(path / TRAINER_STATE, "the trainer state") if (path / TRAINER_STATE).is_file() else {}
        critic = getattr(getattr(learner, "update", None), "critic", None)
        if critic is not None:
            if "critic" not in trainer:
                raise CheckpointError(f"checkpoint {path} has no critic, but the algorithm trains one")
            critic.model.load_state_dict(trainer["critic"]["model"])
            critic.optimizer.load_state_dict(trainer["critic"]["optimizer"])
        scheduler = getattr(learner, "scheduler", None)
        if scheduler is not None and "scheduler" in trainer:
            scheduler.load_state_dict(trainer["scheduler"])
        if "rng" in trainer:
            set_rng_state(trainer["rng"])
        learner.version = int(meta.get("policy_version", meta["step"]))
        learner.step = int(meta["step"])
        if hasattr(learner, "step_results"):
            learner.step_results.clear()
    return meta
