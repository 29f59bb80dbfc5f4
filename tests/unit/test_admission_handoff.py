"""Admission is a FIFO hand-off (controller/admission.py, issue 44): with many members waiting for work,
a freed slot wakes the one member it goes to, not all of them (O(N) wake-ups and gate checks per
notify, O(N^2) per step's burst at N replicas); members get work in the order they asked; a member that
leaves stops waiting at once; a request's `held_s` ends when its work is handed out, not when its thread
wakes to take it."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from controller.admission import AdmissionQueue
from controller.generation import Leaving
from controller.journal import Journal
from controller.loop import GRPOLoop
from controller.outputs import RunWriter
from controller.recovery import Stopped
from rlfleet.config import JobConfig
from rlfleet.data.prompts import Prompt, PromptSource
from tests.unit.test_loop_recovery import Faults, FakeLearner, FakeReward, FakeRollout

pytestmark = [pytest.mark.unit, pytest.mark.timeout(180)]

DEADLINE_S = 60.0  # generous: a loaded 2-core machine


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


class CountingGate:
    """The loop's staleness gate, counting how often admission is checked against it."""

    def __init__(self, gate) -> None:
        self.gate = gate
        self.checks = 0

    def admission_limit(self, rollout_version: int) -> int:
        self.checks += 1
        return self.gate.admission_limit(rollout_version)

    def __getattr__(self, name: str):
        return getattr(self.gate, name)


class FleetRollout(FakeRollout):
    """A fake replica at an address of its own, whose channel the fleet closes when it leaves."""

    def __init__(self, address: str) -> None:
        super().__init__(Faults())
        self.address = address
        self.closed = False

    def close(self) -> None:
        self.closed = True


def fleet_loop(tmp_path, replicas: int) -> GRPOLoop:
    """A loop over `replicas` rollout members (not running: the test plays its training side), each
    request one prompt, the gate closed: every admission slot taken."""
    cfg = JobConfig.model_validate({
        "run": {"output_dir": str(tmp_path), "name": "handoff"},
        "controller": {"prompts_per_step": 2, "max_staleness": 0, "max_steps": 1,
                       "prompts_per_request": 1, "service_wait_s": 20},
        "rollout": {"n": 4}})
    prompts = [Prompt(index=i, text=f"p{i}", prompt_ids=[1, 2], data_source="digits", ground_truth="1")
               for i in range(64)]
    rollouts = [FleetRollout(f"fake-rollout:{1000 + k}") for k in range(replicas)]
    loop = GRPOLoop(cfg, PromptSource(prompts, seed=0), rollouts, FakeReward(Faults()),
                    FakeLearner(Faults()), RunWriter(tmp_path, tensorboard=False), journal=Journal(tmp_path))
    loop.gate = CountingGate(loop.gate)
    loop._admitted = loop.gate.admission_limit(0)
    return loop


class Waiting:
    """Each member asks for work in a task of its own on the loop's event loop, as its generation task
    does."""

    def __init__(self, loop: GRPOLoop) -> None:
        self.loop = loop
        self.admitted: list[str] = []  # member names in the order they got work
        self.ended: dict[str, str] = {}  # member name -> why it stopped waiting without work
        self.lock = threading.Lock()

    def ask(self, member) -> None:
        async def admit() -> None:
            try:
                await self.loop._admit(member)
                with self.lock:
                    self.admitted.append(member.name)
            except (Stopped, Leaving) as exc:
                with self.lock:
                    self.ended[member.name] = type(exc).__name__

        self.loop._streams.submit(admit())

    def free_slot(self) -> None:
        """What the training thread does when it drops a group: a slot given back, the waiters told."""
        with self.loop._cond:
            self.loop._admitted -= 1
            self.loop._wake()

    def stop(self) -> None:
        self.loop.stop.set()
        self.loop._wake()
        wait_for(lambda: self.loop._streams.tasks() == 0, "every waiting member to stop waiting")
        self.loop._streams.close()
        self.loop.journal.close()
        self.loop.writer.close()


def test_a_freed_slot_wakes_the_member_it_goes_to_not_every_waiting_member(tmp_path):
    members_n, freed = 32, 16
    loop = fleet_loop(tmp_path, members_n)
    waiting = Waiting(loop)
    try:
        for member in loop.fleet.members():
            waiting.ask(member)
        wait_for(lambda: loop.gate.checks >= members_n + 1, "every member to ask for work")
        checks_before, began = loop.gate.checks, time.monotonic()
        for k in range(1, freed + 1):
            waiting.free_slot()
            wait_for(lambda k=k: len(waiting.admitted) == k, f"admission {k}")
        elapsed = time.monotonic() - began
        checks = loop.gate.checks - checks_before
        # A few checks per freed slot (the hand-out, the check that finds no more work, the new first
        # waiter's), plus the first waiter's poll (2 a second). A herd checks once per waiting member
        # per freed slot: 16 freed among 32..17 waiting is ~400.
        assert checks <= 4 * freed + 4 * elapsed + 8, (checks, elapsed)
        assert len(waiting.admitted) == freed
        # each freed slot woke the member it went to and the new first waiter; nobody else
        assert loop._admission.wakeups <= 2 * freed, loop._admission.wakeups
    finally:
        waiting.stop()
    assert set(waiting.ended.values()) == {"Stopped"} and len(waiting.ended) == members_n - freed


def test_members_get_work_in_the_order_they_asked(tmp_path):
    loop = fleet_loop(tmp_path, 8)
    waiting = Waiting(loop)
    members = loop.fleet.members()
    try:
        for k, member in enumerate(members):
            waiting.ask(member)
            wait_for(lambda k=k: len(loop._admission) == k + 1, f"member {k} to wait")
        for k in range(1, len(members) + 1):
            waiting.free_slot()
            wait_for(lambda k=k: len(waiting.admitted) == k, f"admission {k}")
    finally:
        waiting.stop()
    assert waiting.admitted == [m.name for m in members]


def test_a_member_that_leaves_stops_waiting_and_the_others_keep_their_turn(tmp_path):
    loop = fleet_loop(tmp_path, 4)
    waiting = Waiting(loop)
    members = loop.fleet.members()
    try:
        for k, member in enumerate(members):
            waiting.ask(member)
            wait_for(lambda k=k: len(loop._admission) == k + 1, f"member {k} to wait")
        loop.fleet.remove(members[0], "failed")  # the fleet tells the loop (on_change)
        wait_for(lambda: members[0].name in waiting.ended, "the member that left to stop waiting")
        assert waiting.ended[members[0].name] == "Leaving"
        waiting.free_slot()
        wait_for(lambda: len(waiting.admitted) == 1, "the next member's admission")
    finally:
        waiting.stop()
    assert waiting.admitted == [members[1].name]


def test_held_ends_when_the_work_is_handed_out_not_when_the_waiter_wakes():
    lock = threading.RLock()
    woken = threading.Event()
    queue: AdmissionQueue[str] = AdmissionQueue(lambda waiters: woken.set())
    handed: list[float] = []

    def hand_out_later() -> None:
        time.sleep(0.2)  # the gate holds the member this long
        with lock:
            queue.hand_out(lambda: None if handed else "work", lambda member: True)
            handed.append(time.perf_counter())
            time.sleep(0.1)  # the waiter cannot take its work before the lock is let go: its own latency

    with lock:
        waiter = queue.join("member")
    threading.Thread(target=hand_out_later, daemon=True).start()
    assert woken.wait(DEADLINE_S)
    with lock:
        woke = time.perf_counter()
        assert waiter.work == "work" and len(queue) == 0
    held = waiter.held_s()
    assert held >= 0.2 and waiter.joined_at + held <= handed[0]
    assert woke - (waiter.joined_at + held) >= 0.1
    assert queue.wakeups == 1


def test_a_member_refused_work_is_held_from_the_last_hand_out_before_it():
    """A member that finds no work waits for the gate; the gate had admitted nothing since the last
    hand-out, so a slot freed after that (its group received late) was held by the gate from when it
    was freed, not from when the controller saw it (bench/fleetsim/measure.py controller_admission)."""
    queue: AdmissionQueue[str] = AdmissionQueue(lambda waiters: None)
    work = ["x"]
    first = queue.join("a")
    before = time.time()
    assert queue.hand_out(lambda: work.pop() if work else None, lambda member: True) == 1
    after = time.time()
    assert first.work == "x" and first.held_since is None  # it got work as it joined: never held
    second = queue.join("b")
    assert queue.hand_out(lambda: None, lambda member: True) == 0  # the gate is closed
    assert before <= second.held_since <= after and second.handed_t is None
    work.append("y")
    handing = time.time()
    assert queue.hand_out(lambda: work.pop() if work else None, lambda member: True) == 1
    assert second.work == "y" and handing <= second.handed_t <= time.time()


def test_a_member_refused_before_any_hand_out_is_held_from_its_join():
    queue: AdmissionQueue[str] = AdmissionQueue(lambda waiters: None)
    before = time.time()
    waiter = queue.join("a")
    queue.hand_out(lambda: None, lambda member: True)
    assert before <= waiter.held_since <= time.time()


def test_a_member_refused_in_the_hand_out_that_gave_the_last_work_is_held_from_it():
    # a and b wait; one piece of work goes to a, and b is refused in the same hand-out: the gate
    # closed at that hand-out, not at any before it, and b was held from when it asked
    queue: AdmissionQueue[str] = AdmissionQueue(lambda waiters: None)
    queue.hand_out(lambda: "earlier", lambda member: True)  # nobody waits: nothing handed
    first = queue.join("first")
    queue.hand_out(lambda: "w0", lambda member: True)
    time.sleep(0.01)
    a, b = queue.join("a"), queue.join("b")
    work = ["w1"]
    queue.hand_out(lambda: work.pop() if work else None, lambda member: True)
    assert first.work == "w0" and a.work == "w1" and b.work is None
    assert b.held_since == b.joined_t > first.handed_t


def test_a_held_members_dispatched_lines_say_since_when_admission_gave_nothing(tmp_path):
    """The loop's own members: one refused work (the gate closed) and let through by a freed slot; its
    `dispatched` lines carry when admission last gave work before it asked and when its work came,
    wall clock, for bench/fleetsim/measure.py to take the gate's hold of the free slot out."""
    from controller.journal import read_journal

    loop = fleet_loop(tmp_path, 1)
    member = loop.fleet.members()[0]
    admitted: list = []

    async def admit() -> None:
        admitted.append(await loop._admit(member))

    closed_at = time.time()  # no work handed out yet: held from its join, after this
    loop._streams.submit(admit())
    try:
        wait_for(lambda: len(loop._admission) == 1, "the member to wait")
        time.sleep(0.05)  # held by the gate
        freed_at = time.time()
        Waiting(loop).free_slot()
        wait_for(lambda: bool(admitted), "the member's admission")
        dispatch, waiter = admitted[0]
        loop._record_dispatch(dispatch, member.address, waiter.hold_fields())
    finally:
        Waiting(loop).stop()
    lines = [e for e in read_journal(tmp_path / "journal" / "prompts.jsonl") if e["event"] == "dispatched"]
    assert len(lines) == 1 and lines[0]["held_s"] >= 0.05
    assert closed_at - 0.001 <= lines[0]["held_since"] <= freed_at - 0.049
    assert freed_at - 0.001 <= lines[0]["handed_t"] <= time.time()
