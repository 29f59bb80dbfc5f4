"""Named units chosen by config: a dict plus a decorator, so no `if name == ...` chains.

    POLICY_LOSSES = Registry("policy loss")

    @POLICY_LOSSES.register("ppo_clip")
    def ppo_clip(...): ...

    POLICY_LOSSES.get(cfg.algorithm.policy_loss)(...)

A unit can also be registered by its import path (`register_path("gspo", "pkg.module:gspo")`):
the registry then knows the name at once and imports the module on the first `get`. That is how
a registry in the core names units that live in one role and import torch, so every process can
check a config's names without importing that role.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class _ImportPath:
    """`pkg.module:attribute` (the attribute may be dotted, e.g. `Class.factory`)."""

    target: str

    def load(self, what: str) -> object:
        module_name, sep, attribute = self.target.partition(":")
        if not sep or not module_name or not attribute:
            raise ValueError(f"{what}: import path {self.target!r} is not of the form pkg.module:name")
        try:
            unit: object = importlib.import_module(module_name)
            for part in attribute.split("."):
                unit = getattr(unit, part)
        except Exception as exc:  # noqa: BLE001 - any failure to load a registered unit is one error
            raise ValueError(f"{what}: cannot load {self.target!r}: {type(exc).__name__}: {exc}") from None
        return unit


class Registry(Generic[T]):
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._units: dict[str, T | _ImportPath] = {}

    def _add(self, name: str, unit: T | _ImportPath) -> None:
        if name in self._units:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self._units[name] = unit

    def register(self, *names: str) -> Callable[[T], T]:
        """Registers the decorated unit under every name given (aliases share one unit)."""
        def add(unit: T) -> T:
            for name in names:
                self._add(name, unit)
            return unit
        return add

    def register_path(self, name: str, target: str) -> None:
        """Registers the unit at `pkg.module:attribute`, imported by the first `get(name)`."""
        self._add(name, _ImportPath(target))

    def get(self, name: str) -> T:
        try:
            unit = self._units[name]
        except KeyError:
            raise ValueError(self.unknown(name)) from None
        if isinstance(unit, _ImportPath):
            unit = self._units[name] = unit.load(f"{self.kind} {name!r}")  # type: ignore[assignment]
        return unit  # type: ignore[return-value]

    def unknown(self, name: str) -> str:
        """The one-line error for a name that is not registered."""
        return f"unknown {self.kind} {name!r}; registered: {', '.join(self.names())}"

    def names(self) -> list[str]:
        return sorted(self._units)

    def __contains__(self, name: object) -> bool:
        return name in self._units
