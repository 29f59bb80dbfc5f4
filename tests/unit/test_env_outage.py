"""The controller's environment outage: admission pauses when an episode could not reach the
environment, resumes when its health says SERVING, and the run stops after env.max_outage_s."""
from __future__ import annotations

import threading

import pytest

from controller.env_outage import EnvOutage, EnvOutageExpired

pytestmark = pytest.mark.unit


def test_outage_pauses_until_the_environment_answers_again():
    now = [100.0]
    healthy = threading.Event()
    changes = []
    back = threading.Event()  # told that the outage is over: the probe thread's last act

    def told(state: str, fields: dict) -> None:
        changes.append((state, fields))
        if state == "running":
            back.set()
    outage = EnvOutage(30.0, probe=healthy.is_set, clock=lambda: now[0], probe_every_s=0.01,
                       on_change=told)
    assert not outage.blocked() and outage.expired() is None
    outage.failed("episode p0/1: environment h:1 Step: UNAVAILABLE: connection refused")
    outage.failed("again")  # one outage, one warning, however many episodes fail
    assert outage.blocked() and outage.outages == 1
    now[0] = 120.0
    assert outage.expired() is None  # 20 s < 30 s
    now[0] = 131.0
    assert isinstance(outage.expired(), EnvOutageExpired) and "env.max_outage_s=30" in str(outage.expired())
    now[0] = 125.0
    healthy.set()  # the probe thread sees SERVING and ends the outage
    # Waits on the change being told, not on `blocked()` turning false for a while: the state flips
    # before the change is told, and on a loaded machine the probe thread can be preempted in
    # between (seen: the list still held only "outage"). 30 s is a bound for a stalled machine, not
    # a tuning: a probe that never sees the recovery still fails here.
    assert back.wait(30), "the probe thread never ended the outage"
    assert not outage.blocked() and outage.expired() is None
    assert [c[0] for c in changes] == ["outage", "running"]
    assert changes[0][1]["cause"].startswith("episode p0/1") and changes[1][1]["outage_s"] == 25.0
    outage.close()
