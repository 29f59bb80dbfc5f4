"""Checkpoints in HF format plus everything a resumed run needs, written atomically.

A checkpoint folder `step_N/` holds the model (HF format; only the adapters under LoRA),
the tokenizer, `optimizer.pt`, `trainer_state.pt` (RNG states of python, numpy and torch,
the critic's weights and optimizer when PPO trains one, an LR scheduler's state if any)
and `meta.json` (step, policy version, and the size of every file). It is built in
`step_N.tmp-<pid>` and renamed to `step_N` only when complete, with `meta.json` written
last, so a half-written one is never picked. Loading checks every file against the sizes
in `meta.json`; a missing or truncated file is a CheckpointError naming it.
"""
from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlfleet.errors import CheckpointError

META = "meta.json"
OPTIMIZER = "optimizer.pt"
TRAINER_STATE = "trainer_state.pt"
FORMAT = 2


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
    files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}
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


def latest_checkpoint(root: Path) -> Path | None:
    """The highest complete step_N folder (one with meta.json), or None."""
    found = complete_checkpoints(root)
    return found[max(found)] if found else None


def resolve_checkpoint(root: Path, spec: str | None) -> Path | None:
    """`latest` -> the newest complete checkpoint under root (CheckpointError if none); `auto` ->
    the same or None; a path -> that folder (it must be complete); None/"" -> None."""
    if not spec:
        return None
    if spec in ("latest", "auto"):
        found = latest_checkpoint(root)
        if found is None and spec == "latest":
            raise CheckpointError(f"no complete checkpoint under {root} to resume from")
        return found
    path = Path(spec)
    if not (path / META).is_file():
        raise CheckpointError(f"checkpoint {path} is missing or incomplete (no {META})")
    return path


def read_meta(path: Path) -> dict[str, Any]:
    try:
        return json.loads((path / META).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"checkpoint {path} has no readable {META}: {exc}") from None


def verify_checkpoint(path: Path) -> dict[str, Any]:
    """meta.json, after checking every file it lists is there with its recorded size."""
    meta = read_meta(path)
    for name, size in meta.get("files", {}).items():
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"checkpoint {path} is corrupt: {name} is missing")
        if file.stat().st_size != size:
            raise CheckpointError(f"checkpoint {path} is corrupt: {name} has {file.stat().st_size} bytes, "
                                  f"{size} were written")
    return meta


def _load(path: Path, what: str) -> Any:
    try:
        # weights_only: a checkpoint folder may come from elsewhere; never unpickle arbitrary objects.
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises several types for a damaged file
        raise CheckpointError(f"checkpoint {path.parent} is corrupt: cannot read {what} "
                              f"({path.name}): {exc}") from None


def _load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except Exception as exc:  # noqa: BLE001
        raise CheckpointError(f"checkpoint {path.parent} is corrupt: cannot read "
                              f"{path.name}: {exc}") from None


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


def restore_learner(learner: Any, path: Path) -> dict[str, Any]:
    """Loads a checkpoint into a freshly built Learner: weights (or adapters), optimizer, critic,
    LR scheduler, RNG states, step and policy version. Returns the checkpoint's meta."""
    meta = verify_checkpoint(path)
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
    return meta
