"""The controller's environment outage: admission pauses when an episode could not reach the
environment, resumes when its health says SERVING, and the run stops after env.max_outage_s."""
from __future__ import annotations

import threading
import time

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
    # Waits on the change being told, then on `blocked()` turning false: the change is told (the
    # journal) before the state flips, and on a loaded machine the probe thread can be preempted in
    # between. 30 s is a bound for a stalled machine, not a tuning: a probe that never sees the
    # recovery still fails here.
    assert back.wait(30), "the probe thread never ended the outage"
    deadline = time.monotonic() + 30
    while outage.blocked() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not outage.blocked() and outage.expired() is None
    assert [c[0] for c in changes] == ["outage", "running"]
    assert changes[0][1]["cause"].startswith("episode p0/1") and changes[1][1]["outage_s"] == 25.0
    outage.close()


def test_each_change_is_journalled_before_admission_sees_it():
    """The journal records an outage before admission pauses and its end before admission resumes
    (as a requeue is journalled before its prompts can be dispatched again), so that no dispatch
    can be journalled after the outage's end was decided but before the journal says so. Seen by
    the callback that journals: admission's view (`blocked()`) when each change is told."""
    seen = []
    outage = EnvOutage(30.0, probe=lambda: False, probe_every_s=3600.0,
                       on_change=lambda state, fields: seen.append((state, outage.blocked())))
    outage.failed("episode p0/1: environment h:1 Step: UNAVAILABLE")
    assert outage.blocked()
    outage.recovered()
    assert not outage.blocked()
    # told "outage" while admission still ran; told "running" while it was still paused
    assert seen == [("outage", False), ("running", True)]
    outage.close()
