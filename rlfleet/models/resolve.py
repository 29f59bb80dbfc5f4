"""Turns `model.path` into a local folder that transformers can load."""
from __future__ import annotations

from pathlib import Path

from rlfleet.config import BUILTIN_MODEL
from rlfleet.errors import ConfigError


def resolve_model_path(path: str) -> Path:
    if path == BUILTIN_MODEL:
        from rlfleet.models.tiny import ensure_tiny_model
        return ensure_tiny_model()
    folder = Path(path).expanduser()
    if not (folder / "config.json").is_file():
        raise ConfigError(f"model.path = {path!r}: no config.json there (a local HF model folder or "
                          f"{BUILTIN_MODEL} is needed; hub downloads are not used)")
    return folder
