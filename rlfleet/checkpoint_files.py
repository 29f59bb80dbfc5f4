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
# The digest checks `rlfleet run` made before starting the learner of a resume (DigestChecks.export).
VERDICTS_ENV = "RLFLEET_CHECKPOINT_VERDICTS"
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


class DigestChecks:
    """The digest checks one process has made, so a resume reads each checkpoint's files once.

    Issue 22: a resuming learner hashed the damaged checkpoints newer than the one it loads when it
    started and again at every ListCheckpoints (warning each time), and under `rlfleet run` the
    launcher had hashed all of them once before. Kept per folder and its meta.json's sha256:
    - a folder found damaged stays damaged (it is not read nor warned about again) until its
      meta.json changes (a new checkpoint of that step);
    - a folder found good is taken as good only when handed over by the process that checked it
      moments before (`export` / `adopt`: the launcher to the learner it starts). Otherwise it is
      read again: a checkpoint can be damaged in place after it was checked."""

    def __init__(self) -> None:
        self._bad: dict[str, tuple[str, str]] = {}  # folder -> (meta sha256, why)
        self._good: dict[str, str] = {}  # folder -> meta sha256 (handed over)
        self._checked: dict[str, tuple[str, str | None]] = {}  # this process's verdicts, for export

    @staticmethod
    def _meta_sha(folder: Path) -> str | None:
        try:
            return sha256_of(folder / META)
        except OSError:
            return None

    def known(self, folder: Path) -> bool:
        """Whether `folder` was found damaged before (so not reported again)."""
        key = str(folder.resolve())
        return key in self._bad and self._bad[key][0] == self._meta_sha(folder)

    def verify(self, folder: Path) -> dict[str, Any]:
        """verify_folder(folder), or its verdict of before (see the class)."""
        key, meta_sha = str(folder.resolve()), self._meta_sha(folder)
        if key in self._bad and self._bad[key][0] == meta_sha:
            raise CheckpointError(self._bad[key][1])
        if key in self._good and self._good.pop(key) == meta_sha:  # used once: for the load
            return read_meta(folder)
        try:
            meta = verify_folder(folder)
        except CheckpointError as exc:
            if meta_sha is not None:
                self._bad[key] = (meta_sha, str(exc))
                self._checked[key] = (meta_sha, str(exc))
            raise
        if meta_sha is not None:
            self._checked[key] = (meta_sha, None)
        return meta

    def export(self) -> str:
        """This process's verdicts, for `adopt` in a process it starts right after."""
        return json.dumps([[k, sha, why] for k, (sha, why) in self._checked.items()])

    def adopt(self, exported: str) -> None:
        """Takes over the verdicts of `export` (those whose meta.json is unchanged count)."""
        try:
            verdicts = json.loads(exported)
        except ValueError:
            return
        for key, sha, why in verdicts:
            if why is None:
                self._good[key] = sha
            else:
                self._bad[key] = (sha, why)


def first_good(folders: Iterable[Path], warn: Callable[[str], None] | None = None,
               checks: DigestChecks | None = None) -> tuple[Path | None, list[str]]:
    """The first folder of `folders` (newest first) that verifies, and why each one before it did not.
    Each bad one is reported through `warn` (default: a log warning) as it is passed over, once per
    `checks` (the verdicts of before are reused, and not reported again)."""
    rejected: list[str] = []
    for folder in folders:
        seen = checks is not None and checks.known(folder)
        try:
            (checks.verify if checks is not None else verify_folder)(folder)
        except CheckpointError as exc:
            rejected.append(str(exc))
            if not seen:
                (warn or (lambda m: log.warning(m)))(f"{exc}; passing over it to the previous checkpoint")
            continue
        return folder, rejected
    return None, rejected
