"""Named units chosen by config: a dict plus a decorator, so no `if name == ...` chains.

    POLICY_LOSSES = Registry("policy loss")

    @POLICY_LOSSES.register("ppo_clip")
    def ppo_clip(...): ...

    POLICY_LOSSES.get(cfg.algorithm.policy_loss)(...)
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._units: dict[str, T] = {}

    def register(self, *names: str) -> Callable[[T], T]:
        """Registers the decorated unit under every name given (aliases share one unit)."""
        def add(unit: T) -> T:
            for name in names:
                if name in self._units:
                    raise ValueError(f"{self.kind} {name!r} is registered twice")
                self._units[name] = unit
            return unit
        return add

    def get(self, name: str) -> T:
        try:
            return self._units[name]
        except KeyError:
            raise ValueError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}") from None

    def names(self) -> list[str]:
        return sorted(self._units)

    def __contains__(self, name: object) -> bool:
        return name in self._units
