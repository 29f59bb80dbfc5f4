"""Built-in reward functions by data_source, and loading user functions by import path.

A reward function follows verl's convention:
`fn(data_source, solution_str, ground_truth, extra_info) -> float`.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable

from rlfleet.errors import ConfigError

RewardFn = Callable[..., float]


def builtin_functions() -> dict[str, RewardFn]:
    from rlfleet.data.tasks import TASK_NAME
    from services.reward.fns import digits, gsm8k
    return {
        TASK_NAME: digits.compute_score,
        "openai/gsm8k": gsm8k.compute_score,
        "gsm8k": gsm8k.compute_score,
    }


def load_function(spec: str) -> RewardFn:
    """`pkg.module:function` -> the function; errors name the spec and what is wrong."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"reward.fn = {spec!r}: expected 'auto' or an import path 'pkg.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"reward.fn = {spec!r}: cannot import {module_name}: {exc}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"reward.fn = {spec!r}: {module_name} has no function {attr!r}")
    return fn
