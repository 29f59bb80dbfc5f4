"""Dotted command-line overrides (`learner.lr=1e-6`, as verl users write them) and YAML errors in
one line: the parsing a job config goes through before pydantic validates it."""
from __future__ import annotations

from typing import Any

import yaml

from rlfleet.errors import ConfigError


def yaml_problem(exc: yaml.YAMLError) -> str:
    """yaml's error in one line: what and where, without the quoted source and its `^` lines."""
    if not isinstance(exc, yaml.MarkedYAMLError):
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    where = (f" at line {exc.problem_mark.line + 1}, column {exc.problem_mark.column + 1}"
             if exc.problem_mark is not None else "")
    what = f"{exc.problem or 'unexpected content'}{where}"
    if exc.context:
        mark = exc.context_mark
        what += f" ({exc.context}" + (f" at line {mark.line + 1}, column {mark.column + 1})" if mark else ")")
    return what


def parse_override(item: str) -> tuple[list[str], Any]:
    """`a.b=1` -> (["a", "b"], 1); the value is parsed as YAML (so 1e-6, true, [x, y] work)."""
    key, sep, raw = item.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"config override {item!r} is not of the form section.key=value")
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"config override {key}: cannot parse value {raw!r}: {yaml_problem(exc)}") from None
    # YAML reads `1e-6` as a string (it wants `1.0e-6`); pydantic coerces numeric strings.
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for item in overrides:
        path, value = parse_override(item)
        node = data
        for part in path[:-1]:
            if node.get(part) is None:  # absent, or a YAML section whose keys are all commented out
                node[part] = {}
            child = node[part]
            if not isinstance(child, dict):
                raise ConfigError(f"config override {item!r}: {part} is not a section")
            node = child
        node[path[-1]] = value
    return data
