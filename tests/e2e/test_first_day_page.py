"""docs/first-day.md runs as written: the commands of its `console` blocks, in order, in an empty folder,
with the `rlfleet` command of this Python's environment on the PATH (as `source .venv/bin/activate`
puts it there), each exiting as shown (`# exit N` after a command, else 0) and printing every line
shown under it, in that order. A shown line matches the start of a printed line, whitespace runs and
numbers (ports, rewards, timings, dates) left free: a column appended to the step line still matches;
`…` stands for lines left out."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.e2e.conftest import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PAGE = REPO / "docs" / "first-day.md"
NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")
EXIT = re.compile(r"\s+# exit (\d+)$")


@dataclass
class Step:
    line: int  # in the page
    command: str
    exit_code: int
    shown: list[str] = field(default_factory=list)


def page_steps(text: str) -> list[Step]:
    steps: list[Step] = []
    in_console = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            in_console = line.strip() == "```console"
            continue
        if not in_console:
            continue
        if line.startswith("$ "):
            command, code = line[2:], 0
            if match := EXIT.search(command):
                command, code = command[:match.start()], int(match.group(1))
            steps.append(Step(number, command, code))
        elif line.strip() and line.strip() != "…":
            steps[-1].shown.append(line.rstrip())
    return steps


def line_pattern(shown: str) -> re.Pattern[str]:
    """`shown` with its numbers free and its whitespace runs of any length, matched at a line's start."""
    parts, at = [], 0
    for match in NUMBER.finditer(shown):
        parts.append(re.escape(shown[at:match.start()]))
        parts.append(NUMBER.pattern)
        at = match.end()
    parts.append(re.escape(shown[at:]))
    return re.compile(re.sub(r"(?:\\ )+|(?:\\\s)+|\s+", r"\\s+", "".join(parts)))


def missing_lines(shown: list[str], printed: list[str]) -> list[str]:
    """The shown lines not printed in that order (none: all were)."""
    at = 0
    for i, expected in enumerate(shown):
        pattern = line_pattern(expected)
        while at < len(printed) and not pattern.match(printed[at]):
            at += 1
        if at == len(printed):
            return shown[i:]
        at += 1
    return []


def test_the_line_patterns_free_numbers_and_spacing_only() -> None:
    pattern = line_pattern("step    1/5 | reward 0.389 | pg_loss +0.0000")
    assert pattern.match("step   12/50 | reward -1.5 | pg_loss -0.0342 | 1.2 s/step")
    assert not pattern.match("step 1/5 | reward nan | pg_loss +0.0000")
    assert missing_lines(["a 1", "c 3"], ["a 7", "b", "c 9"]) == []
    assert missing_lines(["c 3", "a 1"], ["a 7", "b", "c 9"]) == ["a 1"]


def test_the_first_day_page_runs_as_written(tmp_path: Path) -> None:
    steps = page_steps(PAGE.read_text())
    assert len(steps) >= 10, "the page's console blocks were not found"
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "rlfleet").exists():
        pytest.fail(f"no rlfleet command beside {sys.executable}: `pip install -e .` puts it there")
    # PYTHONPATH: this checkout's code, whichever checkout the environment was installed from; one torch
    # thread per command, as the suite's workers have (the page was written on a 2-core machine: 1 thread)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(REPO),
           "OMP_NUM_THREADS": "1"}
    for step in steps:
        proc = subprocess.run(["bash", "-c", step.command], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=600)  # as a terminal shows both
        printed = proc.stdout.splitlines()
        where = f"docs/first-day.md:{step.line}: $ {step.command}"
        last = "\n".join(printed[-30:])
        assert proc.returncode == step.exit_code, f"{where}\nexit {proc.returncode}\n{last}"
        missing = missing_lines(step.shown, printed)
        assert not missing, f"{where}\nnot printed: {missing[0]!r}\nprinted:\n" + "\n".join(printed[-40:])
