"""Reading deploy/systemd/ the way systemd does: unit files, environment files, command lines.

`command(unit, key, instance, env)` gives the argv systemd would execute for `ExecStart=` (or
`ExecStartPost=`) of a template instantiated as `instance`, with `env` from its
EnvironmentFile: line continuations joined, `%i` specifiers replaced, `${VAR}` substituted
inside a word and a `$VAR` word split at whitespace (systemd.service(5), "Command lines").
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UNITS = REPO / "deploy" / "systemd"
INSTALL_PREFIX = "/opt/rlfleet/bin/"  # where the units expect rlfleet (docs/deployment/systemd.md)


def require_systemd_analyze() -> str:
    path = shutil.which("systemd-analyze")
    if path is None:
        why = "systemd-analyze is not installed (Debian package systemd); CI installs it in .ci/run"
        pytest.fail(why) if os.environ.get("CI") else pytest.skip(why)
    return path


def read_unit(path: Path) -> dict[str, list[tuple[str, str]]]:
    """section -> [(key, value), …] in order (keys may repeat), continuation lines joined."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current, pending = None, ""
    for raw in path.read_text().splitlines():
        line = pending + raw.strip() if pending else raw.strip()
        pending = ""
        if not line or line[0] in "#;":
            continue
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
            sections.setdefault(current, [])
            continue
        key, sep, value = line.partition("=")
        assert sep and current, f"{path.name}: cannot read {line!r}"
        sections[current].append((key.strip(), value.strip()))
    return sections


def values(unit: dict, section: str, key: str) -> list[str]:
    return [v for k, v in unit.get(section, []) if k == key]


def read_env_file(path: Path) -> dict[str, str]:
    """systemd's EnvironmentFile=: KEY=VALUE lines, # and ; comments, quotes removed, no expansion."""
    env = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        key, sep, value = line.partition("=")
        assert sep and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key.strip()), f"{path.name}: bad line {raw!r}"
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        env[key.strip()] = value
    return env


def specifiers(text: str, unit_name: str, instance: str) -> str:
    prefix = unit_name.split("@", 1)[0]
    table = {
        "i": instance,
        "I": instance,
        "p": prefix,
        "P": prefix,
        "n": f"{prefix}@{instance}.service",
        "%": "%",
    }

    def one(match: re.Match) -> str:
        assert match.group(1) in table, f"{unit_name}: specifier %{match.group(1)} not handled here"
        return table[match.group(1)]

    return re.sub(r"%(.)", one, text)


def expand_command(line: str, env: dict[str, str]) -> list[str]:
    argv: list[str] = []
    for word in shlex.split(line):
        whole = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if whole:  # $VAR as a word of its own: split at whitespace, empty gives no argument
            argv += env.get(whole.group(1), "").split()
            continue
        for name in re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", word):
            assert name in env, f"${{{name}}} is not set by the environment file"
        argv.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env[m.group(1)], word))
    return argv


def unit_env(path: Path, instance: str, env_file_env: dict[str, str]) -> dict[str, str]:
    """The unit's Environment= assignments, then its EnvironmentFile (systemd's order of precedence)."""
    unit = read_unit(path)
    env: dict[str, str] = {}
    for assignment in values(unit, "Service", "Environment"):
        for item in shlex.split(specifiers(assignment, path.name, instance)):
            key, _, value = item.partition("=")
            env[key] = value
    return {**env, **env_file_env}


def command(path: Path, key: str, instance: str, env: dict[str, str]) -> list[str]:
    """argv of the unit's `key=` command (one of them) for this instance and environment."""
    (line,) = values(read_unit(path), "Service", key)
    argv = expand_command(specifiers(line, path.name, instance), env)
    assert argv[0].startswith(INSTALL_PREFIX), f"{path.name}: {key} runs {argv[0]}, not {INSTALL_PREFIX}…"
    return argv


def install_copies(unit_dir: Path, rlfleet_bin: str) -> list[Path]:
    """Copies of the units that run this checkout's rlfleet instead of /opt/rlfleet/bin/rlfleet
    (`systemd-analyze verify` checks that every command exists)."""
    copies = []
    for template in sorted(UNITS.glob("rlfleet*@.*")):
        copy = unit_dir / template.name
        copy.write_text(template.read_text().replace(INSTALL_PREFIX + "rlfleet", rlfleet_bin))
        copies.append(copy)
    return copies


def verify(unit_dir: Path, names: list[str]) -> subprocess.CompletedProcess:
    """`systemd-analyze verify` of instantiated units (NAME@INSTANCE.service) found in `unit_dir`."""
    return subprocess.run(
        [require_systemd_analyze(), "verify", "--man=no", *names],
        cwd=unit_dir,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
