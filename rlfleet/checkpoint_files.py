"""The manifest of a checkpoint folder: every file's size and sha256, and the checks made on load.

A checkpoint folder holds `meta.json`, written last, which lists each other file with its size
and the sha256 of its content. Sizes alone miss a file damaged in place (a flipped disk block,
a bad copy), which loads fine and trains on garbage; the digest catches it. Checking reads every
byte once (about 1-2 GB/s per core), which is small next to loading the same files.

Core code: the learner writes and loads checkpoints with it and reports to a resuming controller
(Learner.ListCheckpoints) only checkpoints that pass, so `controller.resume=latest` takes the
newest checkpoint that is good, passing over damaged ones with a warning.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import structlog

from rlfleet.errors import CheckpointError

log = structlog.get_logger(__name__)

META = "meta.json"
_CHUNK = 8 << 20


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def file_manifest(folder: Path) -> dict[str, dict[str, Any]]:
    """{name: {size, sha256}} of every file directly in `folder` (meta.json excluded)."""
    return {p.name: {"size": p.stat().st_size, "sha256": sha256_of(p)}
            for p in sorted(folder.iterdir()) if p.is_file() and p.name != META}


def read_meta(folder: Path) -> dict[str, Any]:
    try:
        meta = json.loads((folder / META).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"checkpoint {folder} has no readable {META}: {exc}") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"checkpoint {folder}: {META} is not a JSON object")
    return meta


def verify_folder(folder: Path) -> dict[str, Any]:
    """The folder's meta.json, after checking every file it lists: present, of its recorded size
    and (when recorded) of its recorded sha256. A CheckpointError names the first bad file."""
    meta = read_meta(folder)
    files = meta.get("files", {})
    entries = {name: (entry if isinstance(entry, dict) else {"size": entry}) for name, entry in files.items()}
    for name, entry in entries.items():  # sizes first: a truncated file is found without reading any
        file = folder / name
        if not file.is_file():
            raise CheckpointError(f"checkpoint {folder} is corrupt: {name} is missing")
        if file.stat().st_size != entry.get("size"):
            raise CheckpointError(f"checkpoint {folder} is corrupt: {name} has {file.stat().st_size} bytes, "
                                  f"{entry.get('size')} were written")
    for name, entry in entries.items():
        if "sha256" in entry and sha256_of(folder / name) != entry["sha256"]:
            raise CheckpointError(f"checkpoint {folder} is corrupt: the content of {name} changed "
                                  "since it was written (sha256 differs from meta.json)")
    return meta


def first_good(folders: Iterable[Path],
               warn: Callable[[str], None] | None = None) -> tuple[Path | None, list[str]]:
    """The first folder of `folders` (newest first) that verifies, and why each one before it did not.
    Each bad one is reported through `warn` (default: a log warning) as it is passed over."""
    rejected: list[str] = []
    for folder in folders:
        try:
            verify_folder(folder)
        except CheckpointError as exc:
            rejected.append(str(exc))
            (warn or (lambda m: log.warning(m)))(f"{exc}; passing over it to the previous checkpoint")
            continue
        return folder, rejected
    return None, rejected
