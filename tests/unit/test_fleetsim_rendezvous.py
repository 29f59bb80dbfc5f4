"""The simulator's weight group (bench/fleetsim/rendezvous.py) behaves as a real one does: a push ends
once every rank has pulled; a rank that never arrives fails the rendezvous; a rank that died inside
the group (its socket gone) hangs the broadcast until the group's timeout, which then fails it."""
from __future__ import annotations

import threading
import time

import pytest

from rlfleet.errors import WeightSyncError
from bench.fleetsim.rendezvous import RendezvousMember, RendezvousServer

pytestmark = pytest.mark.unit


def _pull_in_thread(member: RendezvousMember, version: int, errors: list) -> threading.Thread:
    def pull() -> None:
        try:
            member.pull(version)
        except WeightSyncError as exc:
            errors.append(exc)
    thread = threading.Thread(target=pull)
    thread.start()
    return thread


def test_a_push_ends_when_every_rank_pulled_and_releases_them():
    server = RendezvousServer()
    address = server.open(world_size=3)  # the learner and two members
    members = [RendezvousMember(address, rank, timeout_s=30) for rank in (1, 2)]
    errors: list = []
    threads = [_pull_in_thread(m, 1, errors) for m in members]
    server.push(address, 1, timeout_s=30, broadcast_s=0.0)
    for t in threads:
        t.join(30)
    assert errors == [] and not any(t.is_alive() for t in threads)
    threads = [_pull_in_thread(m, 2, errors) for m in members]  # the next version, same group
    server.push(address, 2, timeout_s=30, broadcast_s=0.0)
    for t in threads:
        t.join(30)
    assert errors == []


def test_a_rank_that_never_arrives_fails_the_rendezvous_and_is_named():
    server = RendezvousServer()
    address = server.open(world_size=3)
    arrived = RendezvousMember(address, 1, timeout_s=30)
    RendezvousMember(address, 2, timeout_s=30)  # joined, never pulls
    errors: list = []
    thread = _pull_in_thread(arrived, 1, errors)
    with pytest.raises(WeightSyncError, match=r"rank\(s\) \[2\] did not connect"):
        server.push(address, 1, timeout_s=0.5, broadcast_s=0.0)
    thread.join(30)
    assert len(errors) == 1 and "did not connect" in str(errors[0])  # the waiting rank is told


def test_a_rank_that_dies_inside_the_group_hangs_the_broadcast_until_the_timeout():
    server = RendezvousServer()
    address = server.open(world_size=3)
    alive, doomed = (RendezvousMember(address, rank, timeout_s=30) for rank in (1, 2))
    errors: list = []
    threads = [_pull_in_thread(m, 1, errors) for m in (alive, doomed)]
    server.push(address, 1, timeout_s=30, broadcast_s=0.0)  # connected with both
    for t in threads:
        t.join(30)
    doomed.close()  # its process dies: the socket goes, it never enters the next broadcast
    thread = _pull_in_thread(alive, 2, errors)
    with pytest.raises(WeightSyncError, match=r"version 2 timed out .* rank\(s\) \[2\]"):
        server.push(address, 2, timeout_s=0.5, broadcast_s=0.0)
    thread.join(30)
    assert len(errors) == 1


def test_an_abort_ends_a_push_waiting_for_a_rank_that_never_comes_and_tells_the_members():
    """As the learner's AbortWeightGroup (issue 44): the push ends at once, not at its rank wait."""
    server = RendezvousServer()
    address = server.open(world_size=3)
    arrived = RendezvousMember(address, 1, timeout_s=30)  # rank 2 died after the group was opened
    errors: list = []
    thread = _pull_in_thread(arrived, 1, errors)
    pushed: list = []

    def push() -> None:
        try:
            server.push(address, 1, timeout_s=60, broadcast_s=0.0)  # a rank wait of 20 s
        except WeightSyncError as exc:
            pushed.append(exc)
    pusher = threading.Thread(target=push)
    pusher.start()
    assert server.wait_pushing(address, 30)  # the push is in its rank wait
    began = time.monotonic()
    assert server.abort(address, "rank 2's pull failed") is True
    pusher.join(30)
    thread.join(30)
    assert time.monotonic() - began < 5  # not the 20 s rank wait
    assert len(pushed) == 1 and "aborted" in str(pushed[0]) and "rank 2's pull failed" in str(pushed[0])
    assert len(errors) == 1 and "aborted" in str(errors[0])  # the surviving member is told
    with pytest.raises(WeightSyncError, match="aborted"):  # the group is gone: a later push fails at once
        server.push(address, 1, timeout_s=60, broadcast_s=0.0)


def test_an_abort_ends_a_broadcast_hung_on_a_dead_member():
    server = RendezvousServer()
    address = server.open(world_size=3)
    alive, doomed = (RendezvousMember(address, rank, timeout_s=30) for rank in (1, 2))
    errors: list = []
    threads = [_pull_in_thread(m, 1, errors) for m in (alive, doomed)]
    server.push(address, 1, timeout_s=30, broadcast_s=0.0)
    for t in threads:
        t.join(30)
    doomed.close()
    thread = _pull_in_thread(alive, 2, errors)
    threading.Timer(0.2, lambda: server.abort(address, "rank 2 is gone")).start()
    began = time.monotonic()
    with pytest.raises(WeightSyncError, match="aborted"):
        server.push(address, 2, timeout_s=60, broadcast_s=0.0)  # would hang 60 s on the dead member
    assert time.monotonic() - began < 5
    thread.join(30)
    assert len(errors) == 1 and "aborted" in str(errors[0])


def test_an_abort_of_a_group_nobody_pushes_on_is_harmless():
    server = RendezvousServer()
    assert server.abort("127.0.0.1:1", "stray") is False  # no such group
    kept, idle = server.open(world_size=2), server.open(world_size=2)
    assert server.abort(idle, "its member failed") is False  # nobody pushed on it
    member = RendezvousMember(kept, 1, timeout_s=30)
    errors: list = []
    thread = _pull_in_thread(member, 1, errors)
    server.push(kept, 1, timeout_s=30, broadcast_s=0.0)  # the other group is untouched
    thread.join(30)
    assert errors == []
