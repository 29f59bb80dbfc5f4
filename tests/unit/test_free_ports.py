"""tests/free_ports.py: a port named before its server binds it is never handed out twice, neither in
one test process (a test that names a controller's and its services' ports before any binds) nor across
pytest-xdist workers (each draws from a range of its own). A fresh-clone run lost the systemd test to
this: its controller found its port taken ("cannot bind 127.0.0.1:27732: the port is already in use")."""
from __future__ import annotations

import pytest

from tests import free_ports
from tests.free_ports import port_for_later


@pytest.fixture
def fresh(monkeypatch):
    """Nothing handed out yet, a known ephemeral range, and no xdist worker unless a test sets one."""
    monkeypatch.setattr(free_ports, "_handed_out", set(), raising=False)
    monkeypatch.setattr(free_ports, "_ephemeral_start", lambda: 32768)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    return monkeypatch


def test_ports_named_in_one_process_are_all_different(fresh):
    # 2,000 random draws from 22,768 ports would repeat one almost surely (expected ~88 repeats).
    ports = [port_for_later() for _ in range(2000)]
    assert len(set(ports)) == len(ports)
    assert all(free_ports.LOWEST <= p < 32768 for p in ports)


def test_each_xdist_worker_draws_from_its_own_range(fresh):
    drawn = {}
    fresh.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    for worker in ("gw0", "gw1"):
        fresh.setenv("PYTEST_XDIST_WORKER", worker)
        drawn[worker] = [port_for_later() for _ in range(300)]
    assert max(drawn["gw0"]) < min(drawn["gw1"])
    assert free_ports.LOWEST <= min(drawn["gw0"]) and max(drawn["gw1"]) < 32768


def test_a_worker_range_too_small_falls_back_to_the_kernel(fresh):
    # 200 workers share 22,768 ports: ~113 each, too few to draw at random from; bind(0) picks one.
    fresh.setenv("PYTEST_XDIST_WORKER_COUNT", "200")
    fresh.setenv("PYTEST_XDIST_WORKER", "gw7")
    assert port_for_later() >= 32768  # the kernel's pick, from the ephemeral range
