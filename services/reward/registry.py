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
    from services.reward.fns import (code, digits, final_number, gsm8k, match, math_answer, penalties,
                                     reasoning_gym)
    return {
        "digits": digits.compute_score,
        "gsm8k": gsm8k.compute_score,
        "gsm8k_flexible": gsm8k.compute_score_flexible,
        "gsm8k_lenient": final_number.compute_score,
        "arithmetic": final_number.compute_score,
        "math": math_answer.compute_score,
        "exact_match": match.exact_match,
        "regex_match": match.regex_match,
        "format": penalties.format_reward,
        "length_penalty": penalties.length_penalty,
        "code": code.compute_score,
        "reasoning_gym": reasoning_gym.compute_score,
    }


# What a report says a built-in scored by (`rlfleet eval`, recipe tables): a bare name can hide a change
# of rule, as `gsm8k` changed from the lenient final number to verl's strict method.
RULE_LABELS = {
    "gsm8k": "gsm8k (verl strict: '#### N' in the last 300 chars)",
    "gsm8k_flexible": "gsm8k_flexible (verl flexible: last number in the last 300 chars)",
    "gsm8k_lenient": "gsm8k_lenient (after ####, else last number; none if cut at the budget)",
    "arithmetic": "arithmetic (after ####, else last number; none if cut at the budget)",
}


def builtin_names_by_source() -> dict[str, str]:
    """data_source -> the name of the built-in `auto` picks for it."""
    from rlfleet.data import arithmetic
    from rlfleet.data.tasks import TASK_NAME
    return {
        TASK_NAME: "digits",
        arithmetic.TASK_NAME: "arithmetic",
        "openai/gsm8k": "gsm8k",
        "gsm8k": "gsm8k",
        "math": "math",
        "lighteval/MATH": "math",
        "DigitalLearningGmbH/MATH-lighteval": "math",
        "HuggingFaceH4/MATH-500": "math",
        "code": "code",
    }


# data_source prefixes `auto` picks a built-in for, when no exact data_source above matches.
BUILTIN_PREFIXES = {"reasoning_gym/": "reasoning_gym"}


def builtin_name_for(data_source: str) -> str | None:
    """The built-in `auto` picks for `data_source` (exact name first, then prefix), or None."""
    exact = builtin_names_by_source().get(data_source)
    if exact is not None:
        return exact
    return next((name for prefix, name in BUILTIN_PREFIXES.items() if data_source.startswith(prefix)), None)


# Built-ins whose every call ends soon by construction (regexes of fixed shape, arithmetic; `code` runs
# the program in its own sandboxed subprocess with a deadline): safe to call in the reward service's own
# process. `math` is not: sympy simplification has no deadline there (math-verify's SIGALRM timeouts
# work only on a main thread), and `regex_match` runs a pattern from the config.
BOUNDED_BUILTINS = ("digits", "gsm8k", "gsm8k_flexible", "gsm8k_lenient", "arithmetic", "exact_match",
                    "format", "length_penalty", "code")


def is_bounded_builtin(fn: RewardFn) -> bool:
    """`fn` (possibly with params bound by load_function) is one of BOUNDED_BUILTINS."""
    target = fn.func if isinstance(fn, functools.partial) else fn
    named = named_functions()
    return any(target is named[name] for name in BOUNDED_BUILTINS)


def builtin_functions() -> dict[str, RewardFn]:
    """Built-in rewards by data_source, which `auto` picks from."""
    named = named_functions()
    return {source: named[name] for source, name in builtin_names_by_source().items()}


def rule_label(fn: str, data_source: str) -> str:
    """The rule `reward.fn=fn` scores `data_source` by, as reports name it."""
    name = (builtin_name_for(data_source) or "none") if fn == "auto" else fn
    return RULE_LABELS.get(name, name)


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
