"""Bounded staleness, enforced in one place (AReaL-style admission).

Groups are consumed `batch_groups` per step, in admission order, so the k-th
admitted group (0-based) is trained at step k // batch_groups at the earliest,
when the learner is at version k // batch_groups. A group started under rollout
version v therefore meets `train_version - v <= max_staleness` if it is admitted
only while k // batch_groups - v <= max_staleness, i.e. k < (v + S + 1) * B.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StalenessGate:
    batch_groups: int
    max_staleness: int

    def admission_limit(self, rollout_version: int) -> int:
        """How many groups may have been admitted in total while the rollout serves this version."""
        return (rollout_version + self.max_staleness + 1) * self.batch_groups

    def can_admit(self, admitted: int, rollout_version: int) -> bool:
        return admitted < self.admission_limit(rollout_version)

    def is_fresh(self, generation_version: int, train_version: int) -> bool:
        return train_version - generation_version <= self.max_staleness
