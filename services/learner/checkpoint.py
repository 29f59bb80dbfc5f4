"""Checkpoints in HF format plus optimizer state, written atomically.

A checkpoint is built in `step_N.tmp-<pid>` and renamed to `step_N` only when
complete, with `meta.json` written last, so a half-written one is never picked.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from rlfleet.errors import CheckpointError

META = "meta.json"


def save_checkpoint(root: Path, step: int, model: torch.nn.Module, tokenizer: Any,
                    optimizer: torch.optim.Optimizer, meta: dict[str, Any]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step}"
    tmp = root / f"step_{step}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    model.save_pretrained(tmp, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    (tmp / META).write_text(json.dumps({"step": step, **meta}, indent=2))
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    return final


def latest_checkpoint(root: Path) -> Path | None:
    """The highest complete step_N folder (one with meta.json), or None."""
    best: tuple[int, Path] | None = None
    for child in root.glob("step_*"):
        suffix = child.name.removeprefix("step_")
        if suffix.isdigit() and (child / META).is_file():
            if best is None or int(suffix) > best[0]:
                best = (int(suffix), child)
    return best[1] if best else None


def read_meta(path: Path) -> dict[str, Any]:
    try:
        return json.loads((path / META).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"checkpoint {path} has no readable {META}: {exc}") from None
