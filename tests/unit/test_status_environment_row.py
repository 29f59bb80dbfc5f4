"""`rlfleet status`'s environment row, from what the controller reports of it (RunStatus.environments):
its episodes and failures by cause, the last error, or the outage and how long it has lasted."""
from __future__ import annotations

import pytest

from rlfleet.app.status import _fill_environment, _row
from rlfleet.proto.v1 import controller_pb2

pytestmark = pytest.mark.unit


def test_a_failing_environment_shows_its_failures_and_last_error():
    env = controller_pb2.EnvironmentStatus(
        address="h:1", episodes=4096, failed={"invalid_reply": 60, "timeout": 4}, outage="running",
        last_error="episode p1/0:ab: environment h:1 gave the non-finite reward nan")
    row = _row("env", "h:1", health="SERVING")
    _fill_environment(row, env)
    assert row["load"] == "4096 episodes, 64 failed (invalid_reply 60, timeout 4)"
    assert row["last_error"] == env.last_error


def test_an_outage_is_shown_with_its_length_even_while_health_says_serving():
    env = controller_pb2.EnvironmentStatus(address="h:1", episodes=8, failed={"unavailable": 8},
                                           last_error="episode p2/0:ab: environment h:1 Start: UNAVAILABLE",
                                           outage="trial", outage_s=42.4)
    row = _row("env", "h:1", health="SERVING")
    _fill_environment(row, env)
    assert row["load"] == "8 episodes, 8 failed (unavailable 8)"
    assert row["last_error"] == ("outage for 42s (health says SERVING, no episode answered yet): "
                                 "episode p2/0:ab: environment h:1 Start: UNAVAILABLE")
