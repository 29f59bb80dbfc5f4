"""The controller's count of failed episodes: the budget that stops a run whose environment fails every
episode, and the logs (the first error of each cause, then a count per minute)."""
from __future__ import annotations

import pytest
import structlog

from controller.env_failures import EnvFailures, EnvironmentFailing
from rlfleet.types import Completion

pytestmark = pytest.mark.unit


def episode(failure: str = "", error: str = "") -> Completion:
    return Completion(token_ids=[1], logprobs=[0.0], finish_reason="failed" if failure else "stop",
                      policy_version=0, env_failure=failure, env_error=error)


def test_the_run_stops_after_the_budget_of_failures_in_a_row_naming_server_cause_and_count():
    failures = EnvFailures("127.0.0.1:5005", max_consecutive=4)
    nan = episode("invalid_reply", "episode r1/0: environment 127.0.0.1:5005 gave the non-finite reward nan")
    failures.add([nan, nan, nan])  # 3 in a row: within the budget
    failures.add([episode()])  # an answered episode starts the count again
    failures.add([nan, episode("timeout", "episode r2/0: ... DEADLINE_EXCEEDED"), nan])
    with pytest.raises(EnvironmentFailing) as err:
        failures.add([nan])  # 4 in a row
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("environment 127.0.0.1:5005: 4 episodes in a row failed")
    assert "invalid_reply 3, timeout 1" in message and "env.max_consecutive_failures=4" in message
    assert message.endswith("last: " + nan.env_error)
    assert failures.snapshot() == {"episodes": 8, "failed": {"invalid_reply": 6, "timeout": 1},
                                   "last_error": nan.env_error}


def test_unavailable_is_left_to_the_outage_and_a_zero_budget_never_stops():
    failures = EnvFailures("h:1", max_consecutive=2)
    down = episode("unavailable", "episode r/0: environment h:1 Step: UNAVAILABLE: connection refused")
    failures.add([down] * 10)  # env.max_outage_s bounds these, not the budget
    failures.add([episode("rpc_error", "x")])  # nor do they reset it
    with pytest.raises(EnvironmentFailing):
        failures.add([down, episode("rpc_error", "y")])
    never = EnvFailures("h:1", max_consecutive=0)
    never.add([episode("rpc_error", "z")] * 5000)
    assert never.failed["rpc_error"] == 5000


def test_the_first_error_of_each_cause_is_logged_then_a_count_per_minute():
    now = [0.0]
    failures = EnvFailures("h:1", max_consecutive=0, clock=lambda: now[0], report_every_s=60.0)
    with structlog.testing.capture_logs() as logs:
        failures.add([episode("timeout", "episode a/0: late"), episode("timeout", "episode a/1: late")])
        failures.add([episode("rpc_error", "episode b/0: UNAUTHENTICATED")])
        now[0] = 30.0
        failures.add([episode("timeout", "episode c/0: late")] * 5)
        assert len(logs) == 2  # one line per cause so far; the rest wait for the minute
        now[0] = 61.0
        failures.report()
        failures.report()  # nothing new: nothing logged
    events = [entry["event"] for entry in logs]
    assert events[0] == ("environment h:1: an episode failed (timeout): episode a/0: late; further "
                         "failures are counted once a minute")
    assert events[1].startswith("environment h:1: an episode failed (rpc_error): episode b/0: "
                                "UNAUTHENTICATED")
    assert events[2] == "environment h:1: episodes failed in the last 61s: timeout 6"
    assert len(events) == 3
