"""Every `rlfleet …` command shown in README.md and docs/ parses as the `rlfleet` command parses it,
and its `key=value` overrides name real config keys: a doc cannot show a command that is rejected.

Commands are taken from fenced code blocks (one per line, `\\` continuations joined) and from inline
code. Usage notation is read as such: `[optional parts]` are dropped, `a|b` alternatives are each
checked, `…`/`...` after an option stands for its value and is ignored elsewhere, as are trailing
`# comments`. Inline code may name a command without its required arguments (`rlfleet status`,
in prose); everything else it shows must be accepted. A command followed by `# exit N` (N > 0) is a
mistake shown with its error: it must parse, but its `key=value` items need not name config keys.
"""
from __future__ import annotations

import argparse
import re
import shlex
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from rlfleet.config import JobConfig
from rlfleet.app.cli import build_parser

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
REFUSED = re.compile(r"\s#\s*exit [1-9]\d*$")  # `rlfleet run learner.lrr=1  # exit 2`: shown being refused
PLACEHOLDERS = {"ROLE": "rollout"}  # a placeholder for one of a positional's choices
START = re.compile(r"(?:^|\s|`)(?:rlfleet|-m rlfleet\.app\.cli) (?=[a-z-]+)")


def _commands(path: Path) -> list[tuple[int, str, bool]]:
    """(line number, the text after `rlfleet `, inline) of every command shown in the file."""
    found: list[tuple[int, str, bool]] = []
    lines = path.read_text().splitlines()
    fenced, i = False, 0
    while i < len(lines):
        line, number = lines[i], i + 1
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced:
            while line.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                line = line.rstrip()[:-1] + " " + lines[i].strip()
            match = START.search(line)
            if match and not line.lstrip().startswith("#"):
                found.append((number, line[match.end():], False))
        else:
            for code in re.findall(r"`([^`]+)`", line):
                match = START.match(code)
                if match:
                    found.append((number, code[match.end():], True))
        i += 1
    return found


def _variants(text: str) -> list[list[str]]:
    """The argument lists a usage line stands for."""
    text = re.sub(r"\s#\s.*$", "", text)  # a trailing comment
    text = text.replace("\\|", "|")  # a pipe escaped in a markdown table
    while re.search(r"\[[^\[\]]*\]", text):
        text = re.sub(r"\s?\[(?:--|key=|[A-Z]|\.\.\.|…)[^\[\]]*\]", "", text, count=1) if re.search(
            r"\s?\[(?:--|key=|[A-Z]|\.\.\.|…)[^\[\]]*\]",
            text) else text.replace("[", "\0").replace("]", "\1")
    text = text.replace("\0", "[").replace("\1", "]")
    words: list[str] = []
    for word in shlex.split(text, posix=True):
        if word in ("...", "…"):
            if words and words[-1].startswith("-"):
                words.append("0")  # the value of that option (0 also fits an int)
            continue
        words.append(PLACEHOLDERS.get(word, word))
    choices = [w.split("|") if "|" in w and "=" not in w and not w.startswith("-") else [w] for w in words]
    variants: list[list[str]] = [[]]
    for options in choices:
        variants = [v + [o] for v in variants for o in options]
    return variants


def _key_exists(dotted: str) -> bool:
    model: type[BaseModel] | None = JobConfig
    for part in dotted.split("."):
        if model is None or part not in model.model_fields:
            return False
        annotation = model.model_fields[part].annotation
        model = next((t for t in (annotation, *typing.get_args(annotation))
                      if isinstance(t, type) and issubclass(t, BaseModel)), None)
    return True


def _all() -> list[tuple[str, str, bool]]:
    return [(f"{path.relative_to(REPO)}:{number}", text, inline) for path in DOCS
            for number, text, inline in _commands(path)]


class Rejected(Exception):
    pass


def _parse(argv: list[str]) -> argparse.Namespace:
    """As `rlfleet.app.cli.main` parses: argparse, then stray `key=value` items become overrides."""
    args, extra = build_parser().parse_known_args(argv)
    stray = [item for item in extra if "=" not in item or item.startswith("-")]
    if stray or (extra and not hasattr(args, "overrides")):
        raise Rejected(f"unrecognized arguments: {' '.join(stray or extra)}")
    args.overrides = [*getattr(args, "overrides", []), *extra]
    return args


def test_the_docs_show_commands():
    where = {w.split(":")[0] for w, _, _ in _all()}
    assert {"README.md", "docs/reward-api.md", "docs/algorithms.md"} <= where


@pytest.mark.parametrize("where, text, inline", _all(), ids=[w for w, _, _ in _all()])
def test_a_documented_command_is_accepted(where, text, inline, monkeypatch):
    def rejected(parser, message):
        raise Rejected(message)

    monkeypatch.setattr(argparse.ArgumentParser, "error", rejected)  # a message instead of an exit
    for argv in _variants(text):
        try:
            args = _parse(argv)
        except Rejected as exc:
            if inline and str(exc).startswith("the following arguments are required"):
                continue  # prose naming a command, e.g. `rlfleet status`
            pytest.fail(f"{where}: `rlfleet {' '.join(argv)}` is rejected by the rlfleet command: {exc}")
        if REFUSED.search(text):
            continue  # a mistake shown with its error (docs/first-day.md): its keys need not exist
        for item in args.overrides:
            key = item.split("=", 1)[0]
            assert _key_exists(key), \
                f"{where}: `rlfleet {' '.join(argv)}` overrides {key!r}, not a config key"
