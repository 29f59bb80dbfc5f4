"""The stall watchdog (controller/stall.py): the limit, its scaling by the measured step time, and the
one line that names why no step trained. Numbers derived by hand in the comments; a fake clock."""
from __future__ import annotations

from collections import Counter

import pytest

from controller.sample_quota import SampleQuota
from controller.stall import STEP_FACTOR, RunStalled, StallFacts, StallWatchdog

pytestmark = pytest.mark.unit


def test_the_limit_is_max_stall_s_until_steps_run_then_scales_with_the_median_step():
    now = [1000.0]
    dog = StallWatchdog(180.0, clock=lambda: now[0])
    assert STEP_FACTOR == 10.0
    assert dog.limit_s() == 180.0  # no step yet
    now[0] = 1180.0  # exactly 180 s: not beyond the limit
    assert dog.expired(StallFacts) is None
    now[0] = 1180.5
    assert isinstance(dog.expired(StallFacts), RunStalled)
    dog.trained(12.0)  # a 12 s step: 10 x 12 = 120 s < 180 s, the limit stays 180 s
    assert dog.limit_s() == 180.0
    dog.trained(30.0)  # median of 12, 30 = 21: 10 x 21 = 210 s
    assert dog.limit_s() == 210.0
    dog.trained(40.0)  # median of 12, 30, 40 = 30: 300 s
    assert dog.limit_s() == 300.0
    dog.trained(5.0)  # median of 5, 12, 30, 40 = (12 + 30) / 2 = 21: 210 s (one slow step does not stick)
    assert dog.limit_s() == 210.0
    now[0] += 209.0  # 209 s since the last step: within 210 s
    assert dog.expired(StallFacts) is None
    now[0] += 2.0  # 211 s
    stalled = dog.expired(StallFacts)
    assert str(stalled).startswith("no step trained for 211s (limit 210s: 10x the median step, 21.0s): ")
    for _ in range(20):  # the median of the last 20 steps: the old ones are forgotten
        dog.trained(1.0)
    assert dog.limit_s() == 180.0


def test_the_line_names_dropped_groups_environment_failures_replicas_and_waits():
    now = [0.0]
    dog = StallWatchdog(60.0, clock=lambda: now[0])
    dog.waited_on("weight pushes and re-forms", 42.4)
    now[0] = 61.0
    facts = StallFacts(dropped=Counter(unusable=12, stale=3), dropped_samples=60,
                       env_failed=Counter(episode_error=40, timeout=5), env_last_error="at capacity",
                       env_note="a group needs rollout.n=4 sessions", replicas=2, in_flight=8, buffered=1)
    line = str(dog.expired(lambda: facts))
    assert line == ("no step trained for 61s (limit 60s: controller.max_stall_s=60): 15 groups dropped "
                    "(unusable 12: fewer than 2 samples with a reward; stale 3: older than "
                    "controller.max_staleness; 60 samples); environment episodes failed: episode_error 40, "
                    "timeout 5 (last: at capacity); a group needs rollout.n=4 sessions; 2 rollout replicas "
                    "live; 8 prompts in flight, 1 groups buffered; 42s spent on weight pushes and re-forms")
    assert "\n" not in line


def test_an_empty_fleet_and_a_paused_admission_are_named():
    facts = StallFacts(replicas=0, paused="environment outage")
    assert facts.describe() == ("no group came back to train on; no rollout replica in the fleet; 0 prompts "
                                "in flight, 0 groups buffered; admission paused: environment outage")


def test_a_step_restarts_the_clock_and_forgets_the_waits():
    now = [0.0]
    dog = StallWatchdog(10.0, clock=lambda: now[0])
    dog.waited_on("weight pushes", 9.0)
    now[0] = 9.0
    dog.trained(0.5)
    now[0] = 19.0  # 10 s since the step: not beyond
    assert dog.expired(StallFacts) is None
    now[0] = 19.5
    assert "spent on" not in str(dog.expired(StallFacts))


def test_samples_not_trained_on_are_written_at_a_bounded_rate():
    now = [0.0]
    quota = SampleQuota(per_window=10, window_s=60.0, clock=lambda: now[0])
    assert quota.take(4) == 4 and quota.take(4) == 4  # 8 of 10
    assert quota.take(4) == 2 and quota.take(4) == 0  # the window's last 2, then none
    now[0] = 59.9
    assert quota.take(1) == 0
    now[0] = 60.0  # a new window
    assert quota.take(25) == 10
    # 4+4+4+4+1+25 = 42 offered, 4+4+2+0+0+10 = 20 written
    assert (quota.offered, quota.written) == (42, 20)


def test_time_held_for_a_wait_bounded_elsewhere_does_not_count():
    now = [0.0]
    dog = StallWatchdog(10.0, clock=lambda: now[0])
    now[0] = 6.0
    dog.hold()  # from 6 s: a replica is waited for (controller.service_wait_s bounds it)
    now[0] = 100.0
    dog.hold()  # still held: the first hold counts
    now[0] = 103.0  # held 6 -> 103 = 97 s; counted 6 + (103 - 103) = 6 s
    assert dog.expired(StallFacts) is None
    now[0] = 107.0  # 6 + 4 = 10 s counted: not beyond
    assert dog.expired(StallFacts) is None
    now[0] = 107.5  # 10.5 s
    assert str(dog.expired(StallFacts)).startswith("no step trained for 10s (limit 10s")
