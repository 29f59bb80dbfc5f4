"""Built-in environments by name; `pkg.module:Class` loads any other."""
from __future__ import annotations

import difflib
import importlib
from typing import Any

from rlfleet.env.base import Environment
from rlfleet.errors import ConfigError

BUILTIN = {
    "calculator": "environments.calculator:Calculator",
    "python": "environments.python_tool:PythonTool",
    "digits_game": "environments.digits_game:DigitsGame",
}


def environment_class(spec: str) -> Any:
    """What a built-in name or `pkg.module:Class` names, imported (not constructed): `rlfleet run` asks
    before it touches the run folder, so a misspelt name fails in a second."""
    path = BUILTIN.get(spec, spec)
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        close = difflib.get_close_matches(spec.replace("-", "_"), list(BUILTIN), n=1, cutoff=0.6)
        raise ConfigError(f"environment {spec!r} is neither a built-in ({', '.join(sorted(BUILTIN))}) "
                          "nor pkg.module:Class" + (f" (did you mean {close[0]!r}?)" if close else ""))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"environment {spec!r}: cannot import {module_name} ({exc})") from None
    cls = getattr(module, attr, None)
    if cls is None:
        raise ConfigError(f"environment {spec!r}: {module_name} has no {attr}")
    return cls


def load_environment(spec: str, params: dict[str, Any] | None = None) -> Environment:
    """An Environment instance from a built-in name or `pkg.module:Class` (constructed with `params`)."""
    cls = environment_class(spec)
    try:
        env = cls(**(params or {})) if isinstance(cls, type) else cls
    except TypeError as exc:
        raise ConfigError(f"environment {spec!r}: bad parameters {sorted(params or {})}: {exc}") from None
    if not isinstance(env, Environment):
        raise ConfigError(f"environment {spec!r} is a {type(env).__name__}, not an rlfleet.env.Environment")
    return env
