"""The controller's environment outage: admission pauses when an episode could not reach the
environment, resumes for a trial when its health says SERVING, ends when an episode gets through, and
the run stops after env.max_outage_s of UNAVAILABLE, whatever health says."""
from __future__ import annotations

import threading
import time

import pytest

from controller.env_outage import EnvOutage, EnvOutageExpired

pytestmark = pytest.mark.unit


def test_outage_pauses_until_health_says_serving_and_ends_when_an_episode_gets_through():
    now = [100.0]
    healthy = threading.Event()
    changes = []
    outage = EnvOutage(30.0, probe=healthy.is_set, clock=lambda: now[0], probe_every_s=0.01,
                       on_change=lambda state, fields: changes.append((state, fields)))
    assert not outage.blocked() and outage.expired() is None
    outage.failed("episode p0/1: environment h:1 Step: UNAVAILABLE: connection refused")
    outage.failed("again")  # one outage, one warning, however many episodes fail
    assert outage.blocked() and outage.outages == 1
    now[0] = 120.0
    assert outage.expired() is None  # 20 s < 30 s
    now[0] = 131.0
    assert isinstance(outage.expired(), EnvOutageExpired) and "env.max_outage_s=30" in str(outage.expired())
    now[0] = 125.0
    healthy.set()  # the probe thread sees SERVING: admission resumes, for a trial
    # 30 s is a bound for a stalled machine, not a tuning: a probe that never sees SERVING fails here.
    deadline = time.monotonic() + 30
    while outage.blocked() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not outage.blocked() and outage.expired() is None
    assert [c[0] for c in changes] == ["outage"]  # not over yet: no episode got through
    outage.reached()  # an episode got an answer: the outage is over
    assert not outage.blocked() and outage.state == "running"
    assert [c[0] for c in changes] == ["outage", "running"]
    assert changes[0][1]["cause"].startswith("episode p0/1") and changes[1][1]["outage_s"] == 25.0
    outage.close()


def test_unavailable_counts_toward_max_outage_s_while_health_says_serving():
    """A server whose health says SERVING but that answers every call UNAVAILABLE: each trial fails
    again, and the outage, counted from the first failure, ends the run after env.max_outage_s."""
    now = [100.0]
    outage = EnvOutage(30.0, probe=lambda: True, clock=lambda: now[0], probe_every_s=0.01)
    outage.failed("episode p0/1: environment h:1 Start: UNAVAILABLE: configured to be unavailable")
    deadline = time.monotonic() + 30
    for at in (110.0, 120.0, 131.0):
        while outage.blocked() and time.monotonic() < deadline:  # health says SERVING: a trial
            time.sleep(0.01)
        assert not outage.blocked()
        now[0] = at
        outage.failed("episode p1/0: environment h:1 Start: UNAVAILABLE: configured to be unavailable")
        assert outage.blocked() and outage.outages == 1
    expired = outage.expired()
    assert isinstance(expired, EnvOutageExpired), "the outage restarted its clock at each trial"
    assert str(expired).startswith("no environment for 31s (env.max_outage_s=30): episode p1/0")
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
    outage.reached()
    assert not outage.blocked()
    # told "outage" while admission still ran; told "running" while it was still paused
    assert seen == [("outage", False), ("running", True)]
    outage.close()


def test_a_trial_admits_one_request_and_a_paused_admission_none():
    """Issue 42, 6: a server whose health says SERVING while every call fails UNAVAILABLE got ~3,500
    episodes a minute while admission was 'paused': each trial admitted a full gate's worth. A trial now
    admits one request; until its episodes get through (or fail again), nothing more."""
    outage = EnvOutage(300.0, probe=lambda: True, probe_every_s=0.01)
    assert outage.take_admission() and outage.take_admission()  # running: admission is open
    outage.failed("episode p0/1: environment h:1 Start: UNAVAILABLE")
    assert outage.blocked() and not outage.take_admission()  # paused: nothing
    deadline = time.monotonic() + 30
    while outage.state != "trial" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert outage.state == "trial" and not outage.blocked()
    assert outage.take_admission()  # the trial's one request
    assert outage.blocked() and not outage.take_admission()  # and nothing more
    outage.reached()
    assert not outage.blocked() and outage.take_admission() and outage.take_admission()
    outage.close()


def test_each_failed_trial_doubles_the_wait_before_the_next_probe():
    outage = EnvOutage(300.0, probe=lambda: True, probe_every_s=1.0, max_probe_every_s=5.0)
    waits = []
    for _ in range(5):
        outage.failed("UNAVAILABLE")
        waits.append(outage.probe_wait_s)
        outage.state = "trial"  # as the probe thread leaves it once health says SERVING
    assert waits == [1.0, 2.0, 4.0, 5.0, 5.0]  # 1, doubled, capped at 5
    outage.reached()
    outage.failed("UNAVAILABLE")
    assert outage.probe_wait_s == 1.0  # a new outage starts again from the first wait
    outage.close()


def test_the_defaults_end_a_hung_or_unavailable_environment_within_three_minutes():
    """Issue 42, 6: at the defaults a hung environment ran past 300 s. The stall limit (a hung
    environment: episodes time out, no step trains) and the outage bound are each at most 180 s."""
    from rlfleet.config import JobConfig

    cfg = JobConfig()
    assert cfg.controller.max_stall_s <= 180.0 and cfg.env.max_outage_s <= 180.0
