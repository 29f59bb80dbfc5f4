"""StalenessGate: admission limits, freshness, and a simulation of the asynchronous loop.

With B groups per step and max staleness S, the k-th admitted group (0-based) is
trained at version k // B at the earliest; the gate admits it under rollout
version v only while k < (v + S + 1) * B.
"""
from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

import pytest

from controller.staleness import StalenessGate

pytestmark = pytest.mark.unit


def test_synchronous_gate_admits_exactly_one_batch_per_version():
    gate = StalenessGate(batch_groups=4, max_staleness=0)
    # Version 0: groups 0..3 may be admitted, the 5th (admitted == 4) may not.
    assert [gate.can_admit(k, 0) for k in range(6)] == [True] * 4 + [False] * 2
    # Version 1: groups 4..7 (the second batch), not the 9th.
    assert gate.admission_limit(1) == 8
    assert gate.can_admit(7, 1) and not gate.can_admit(8, 1)
    for v in range(5):
        assert gate.admission_limit(v + 1) - gate.admission_limit(v) == 4


def test_gate_with_staleness_two():
    gate = StalenessGate(batch_groups=3, max_staleness=2)
    # (0 + 2 + 1) * 3 = 9 groups may be in flight before the first step.
    assert gate.admission_limit(0) == 9
    assert gate.can_admit(8, 0) and not gate.can_admit(9, 0)
    # Version 2: (2 + 3) * 3 = 15.
    assert gate.admission_limit(2) == 15
    assert gate.can_admit(14, 2) and not gate.can_admit(15, 2)


@pytest.mark.parametrize("S", [0, 1, 2, 5])
def test_is_fresh_boundaries(S):
    gate = StalenessGate(batch_groups=2, max_staleness=S)
    v = 7
    assert gate.is_fresh(v, v)
    assert gate.is_fresh(v, v + S)
    assert not gate.is_fresh(v, v + S + 1)
    # A group newer than the learner (rollout already updated) is fresh.
    assert gate.is_fresh(v + 1, v)


@dataclass
class Sim:
    """Pure-python model of controller.loop: one generation thread and one training thread.

    Generation handles one request at a time and finishes its groups in order; a group
    takes the version the engine serves when it is generated (which may be newer than
    the version it was admitted under). Training takes B groups, oldest version first,
    trains, then syncs weights: the engine swaps first, the controller's view follows.
    """

    B: int
    S: int
    per_request: int
    rng: random.Random
    gate: StalenessGate = field(init=False)
    learner_version: int = 0
    engine_version: int = 0
    gate_version: int = 0  # the controller's view of the served version
    admitted: int = 0
    seq: int = 0
    pending: list[int] = field(default_factory=list)  # admitted, not yet generated (FIFO)
    buffer: list[tuple[int, int]] = field(default_factory=list)  # heap of (version, seq)
    sync_state: int = 0  # 0: nothing to sync, 1: engine to update, 2: controller view to update
    staleness: list[int] = field(default_factory=list)
    dropped: int = 0

    def __post_init__(self) -> None:
        self.gate = StalenessGate(self.B, self.S)

    def actions(self) -> list[str]:
        acts = []
        limit = self.gate.admission_limit(self.gate_version)
        if self.admitted < limit and not self.pending:
            acts.append("admit")
        if self.pending:
            acts.append("generate")
        if self.sync_state:
            acts.append("sync")
        elif len(self.buffer) >= self.B:
            acts.append("train")
        return acts

    def do(self, action: str) -> None:
        if action == "admit":
            count = min(self.per_request, self.gate.admission_limit(self.gate_version) - self.admitted)
            assert count > 0
            self.admitted += count
            self.pending.extend(range(self.seq, self.seq + count))
            self.seq += count
        elif action == "generate":
            heapq.heappush(self.buffer, (self.engine_version, self.pending.pop(0)))
        elif action == "train":
            batch = []
            while len(batch) < self.B and self.buffer:
                version, _ = heapq.heappop(self.buffer)
                if self.gate.is_fresh(version, self.learner_version):
                    batch.append(version)
                else:
                    self.dropped += 1
                    self.admitted -= 1
            assert len(batch) == self.B
            self.staleness.extend(self.learner_version - v for v in batch)
            self.learner_version += 1
            self.sync_state = 1
        elif action == "sync":
            if self.sync_state == 1:
                self.engine_version = self.learner_version
                self.sync_state = 2
            else:
                self.gate_version = self.learner_version
                self.sync_state = 0

    def run(self, steps: int) -> None:
        while self.learner_version < steps:
            acts = self.actions()
            assert acts, "the loop deadlocked"
            self.do(self.rng.choice(acts))


@pytest.mark.parametrize("S", [0, 1, 2])
@pytest.mark.parametrize("B, per_request", [(1, 1), (2, 1), (3, 2), (4, 8)])
def test_simulated_loop_never_exceeds_max_staleness(S, B, per_request):
    worst = 0
    for seed in range(20):
        sim = Sim(B=B, S=S, per_request=per_request, rng=random.Random(seed))
        sim.run(steps=12)
        assert len(sim.staleness) == 12 * B
        assert max(sim.staleness) <= S
        # Admission control means stale work is never started, so nothing is thrown away.
        assert sim.dropped == 0
        # Never more than (S + 1) * B groups admitted beyond those consumed.
        assert sim.admitted - B * sim.learner_version <= (S + 1) * B
        worst = max(worst, max(sim.staleness))
    # The bound is reached: the gate is not stricter than it has to be.
    assert worst == S


def test_simulated_synchronous_loop_is_on_policy():
    sim = Sim(B=3, S=0, per_request=2, rng=random.Random(0))
    sim.run(steps=20)
    assert set(sim.staleness) == {0}
