"""Advantage estimators: one registry, chosen by ``algorithm.advantage``.

An estimator has up to two stages, because its inputs live in two roles:

* ``group``: run by the controller on each group's rewards (it alone has the groups), one
  advantage per completion;
* ``token``: run by the learner over the whole train batch (it alone has token-level
  quantities: KL penalties, critic values). None: the learner broadcasts the controller's
  advantage over the response tokens (rlfleet.advantages.token.broadcast).

Estimators without a group stage get advantage 0 from the controller and compute everything in
their token stage. Adding one is one module with one ``ADVANTAGE_ESTIMATORS.register`` call
(docs/algorithms.md); a module outside rlfleet is loaded by ``algorithm.plugins``. This module
imports no torch, so every process can check `algorithm.advantage` against the registry.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlfleet.registry import Registry

if TYPE_CHECKING:
    from rlfleet.advantages.token import AdvantageInputs, AdvantageOutputs

__all__ = ["ADVANTAGE_ESTIMATORS", "AdvantageEstimator"]

GroupStage = Callable[[list[float]], list[float]]  # rewards_G -> advantages_G
# (one AdvantageInputs per micro-batch, gamma, lam) -> one AdvantageOutputs per micro-batch
TokenStage = Callable[["list[AdvantageInputs]", float, float], "list[AdvantageOutputs]"]


@dataclass(frozen=True)
class AdvantageEstimator:
    group: GroupStage | None = None  # None: the controller sends 0, the token stage does it all
    token: TokenStage | None = None  # None: the learner broadcasts the group stage's advantage
    needs_values: bool = False  # the learner trains a critic and passes its values to `token`

    def __post_init__(self) -> None:
        if self.group is None and self.token is None:
            raise ValueError("an advantage estimator needs a group stage, a token stage, or both")

    def group_advantages(self, rewards_G: list[float]) -> list[float]:
        """What the controller sends for one group."""
        return self.group(rewards_G) if self.group is not None else [0.0] * len(rewards_G)


ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimator] = Registry("advantage estimator")

from rlfleet.advantages import builtin  # noqa: E402,F401 - registers the built-in estimators
