"""End-to-end helpers: run `rlfleet` as a real command in a fresh process."""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def rlfleet(*args: str, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "rlfleet.app.cli", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env=full_env)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "runs"


@dataclass(frozen=True)
class ImportedModel:
    path: Path
    stdout: str  # what `rlfleet model import` printed


@pytest.fixture(scope="session")
def smollm2_import(tmp_path_factory: pytest.TempPathFactory) -> ImportedModel:
    """SmolLM2-135M-Instruct's GGUF imported once per test run through the real command (bfloat16): the
    import takes tens of seconds on two cores, and the tests that take the folder only read it. Under
    pytest-xdist the workers share one import: the first builds it under a lock, the others wait for it."""
    from tests.e2e.real_model import smollm2_gguf

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the run's folder, above each worker's own
    out, printed = shared / "smollm2-135m", shared / "smollm2-135m.import-stdout"
    with open(shared / "smollm2-135m.lock", "a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        if not printed.is_file():  # written last, once the folder is complete
            partial = Path(tempfile.mkdtemp(prefix="smollm2-import-", dir=shared)) / "model"
            proc = rlfleet("model", "import", str(smollm2_gguf()), "--output", str(partial), "--dtype",
                           "bfloat16")
            assert proc.returncode == 0, proc.stderr[-3000:]
            shutil.rmtree(out, ignore_errors=True)  # left by an import that failed after its rename
            partial.rename(out)
            printed.write_text(proc.stdout)
    return ImportedModel(out, printed.read_text())


@pytest.fixture
def smollm2(smollm2_import: ImportedModel) -> Path:
    return smollm2_import.path
