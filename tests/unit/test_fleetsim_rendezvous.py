"""The simulator's weight group (bench/fleetsim/rendezvous.py) behaves as a real one does: a push ends
once every rank has pulled; a rank that never arrives fails the rendezvous; a rank that died inside
the group (its socket gone) hangs the broadcast until the group's timeout, which then fails it."""
from __future__ import annotations

import threading

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
