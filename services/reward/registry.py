"""Built-in reward functions, by name and by data_source, and loading user functions by import path.

A reward function follows verl's convention:
`fn(data_source, solution_str, ground_truth, extra_info, **params) -> float` (or `{"score": x, …}`).
"""
from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

from rlfleet.errors import ConfigError

RewardFn = Callable[..., float]


def named_functions() -> dict[str, RewardFn]:
    """Built-in rewards by the name `reward.fn` or a source's `function` can give."""
    from services.reward.fns import code, digits, gsm8k, match, math_answer, penalties
    return {
        "digits": digits.compute_score,
        "gsm8k": gsm8k.compute_score,
        "math": math_answer.compute_score,
        "exact_match": match.exact_match,
        "regex_match": match.regex_match,
        "format": penalties.format_reward,
        "length_penalty": penalties.length_penalty,
        "code": code.compute_score,
    }


# Built-ins whose every call ends soon by construction (regexes of fixed shape, arithmetic; `code` runs
# the program in its own sandboxed subprocess with a deadline): safe to call in the reward service's own
# process. `math` is not: sympy simplification has no deadline there (math-verify's SIGALRM timeouts
# work only on a main thread), and `regex_match` runs a pattern from the config.
BOUNDED_BUILTINS = ("digits", "gsm8k", "exact_match", "format", "length_penalty", "code")


def is_bounded_builtin(fn: RewardFn) -> bool:
    """`fn` (possibly with params bound by load_function) is one of BOUNDED_BUILTINS."""
    target = fn.func if isinstance(fn, functools.partial) else fn
    named = named_functions()
    return any(target is named[name] for name in BOUNDED_BUILTINS)


def builtin_functions() -> dict[str, RewardFn]:
    """Built-in rewards by data_source, which `auto` picks from."""
    from rlfleet.data.tasks import TASK_NAME
    named = named_functions()
    return {
        TASK_NAME: named["digits"],
        "openai/gsm8k": named["gsm8k"],
        "gsm8k": named["gsm8k"],
        "math": named["math"],
        "lighteval/MATH": named["math"],
        "DigitalLearningGmbH/MATH-lighteval": named["math"],
        "HuggingFaceH4/MATH-500": named["math"],
        "code": named["code"],
    }


def load_function(spec: str, params: dict[str, Any] | None = None) -> RewardFn:
    """A built-in name or `pkg.module:function` -> the function, with `params` bound as keywords."""
    fn = _resolve(spec)
    return functools.partial(fn, **params) if params else fn


def _resolve(spec: str) -> RewardFn:
    named = named_functions()
    if spec in named:
        return named[spec]
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"reward function {spec!r}: expected 'auto', a built-in name {sorted(named)} "
                          f"or an import path 'pkg.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"reward function {spec!r}: cannot import {module_name}: {exc}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"reward function {spec!r}: {module_name} has no function {attr!r}")
    return fn
