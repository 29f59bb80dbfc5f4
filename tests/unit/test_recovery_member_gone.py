"""A replica the run started with fails; while the controller waits for it to come back, the same
replica restarts and rejoins the fleet at its address, which replaces (and closes) the old member.
The thread that waited on the old member ends there: the new member's thread takes the work. Before,
it kept asking the closed member until controller.service_wait_s ran out and then stopped the run."""
from __future__ import annotations

import threading
import time

import pytest

from controller.state import Dispatch
from rlfleet.errors import ServiceUnavailable
from tests.unit.test_eval_reward_outage import _loop

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


class ClosedRollout:
    address = "fake-rollout:1"

    def status(self):
        raise ServiceUnavailable("rollout service at fake-rollout:1: status failed: the channel was closed")


def test_waiting_for_a_failed_replica_ends_when_it_has_left_the_fleet(tmp_path):
    loop = _loop(tmp_path, failures=0, max_outage_s=60)
    loop.recovery.wait_s = 30.0  # controller.service_wait_s: far longer than the test may take
    gone = threading.Event()
    threading.Timer(0.3, gone.set).start()  # the restarted replica rejoins and its old member is removed
    started = time.monotonic()
    still_member = loop.recovery.rollout_failed(ClosedRollout(), Dispatch(seed=None), {},
                                                ServiceUnavailable("Generate failed"), gone=gone.is_set)
    assert still_member is False
    assert time.monotonic() - started < 10  # once it is gone (0.3 s), not after service_wait_s (30 s)
