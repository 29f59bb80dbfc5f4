"""End-to-end helpers: run `rlfleet` as a real command in a fresh process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
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
