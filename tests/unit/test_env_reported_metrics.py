"""The environment's own metrics (StepResult.metrics) in the step's metrics: `env/<name>`, the mean over
the episodes that reported the name of each episode's mean (issue 32: they never appeared)."""
from __future__ import annotations

import math

import pytest

from controller.episodes import env_metrics
from rlfleet.types import Completion, TurnRecord

pytestmark = pytest.mark.unit


def episode(**env_metrics_: float) -> Completion:
    return Completion(token_ids=[1, 2], logprobs=[0.0, 0.0], finish_reason="stop", policy_version=0,
                      turns=(TurnRecord(2, 0, 0, 0),), env_metrics=env_metrics_)


def test_reported_metrics_are_averaged_over_the_episodes_that_report_them():
    metrics = env_metrics([episode(tries=1.0, solved=1.0), episode(tries=2.0, solved=0.0),
                           episode(tries=3.0), episode()])
    assert metrics["env/tries"] == 2.0  # (1 + 2 + 3) / 3: the episode without it does not count
    assert metrics["env/solved"] == 0.5
    assert metrics["env/episodes"] == 4.0


def test_a_name_rlfleet_uses_itself_goes_under_reported_and_nan_is_left_out():
    metrics = env_metrics([episode(episodes=7.0, failed=1.0, score=math.nan), episode(score=0.25)])
    assert metrics["env/episodes"] == 2.0 and metrics["env/failed"] == 0.0  # rlfleet's own
    assert metrics["env/reported/episodes"] == 7.0 and metrics["env/reported/failed"] == 1.0
    assert metrics["env/score"] == 0.25
