"""The controller's reward outage is journalled before admission acts on it, as environment outages
are (tests/unit/test_env_outage.py): the journal records an outage before admission pauses and its end
before admission resumes, so no dispatch can be journalled between a decided change and its record."""
from __future__ import annotations

import pytest

from controller.reward_outage import RewardOutage
from rlfleet.errors import ServiceUnavailable

pytestmark = pytest.mark.unit


def test_each_change_is_journalled_before_admission_sees_it():
    seen = []
    outage = RewardOutage(30.0, on_change=lambda state, fields: seen.append((state, outage.blocked())))
    outage.failed(ServiceUnavailable("reward source 'judge' unreachable"))
    assert outage.blocked()
    outage.failed(ServiceUnavailable("still unreachable"))  # the same outage: told once
    outage.recovered()
    assert not outage.blocked()
    # told "outage" while admission still ran; told "scoring" while it was still paused
    assert seen == [("outage", False), ("scoring", True)]
