"""An item's deadline in the reward worker pool (reward.fn_timeout_s) is the function's time, not the
time a worker takes to start (issue 32: the suite must pass on a loaded machine).

A fresh pool's workers are spawned interpreters that load the reward function; on a loaded 2-core
machine that alone can take seconds. Counted against the first items' deadlines, and again against the
items scored in the pool that replaces one stuck in a hanging item, it failed good items with "no reward
within ..." whenever start-up was slower than the deadline. Here loading takes 2 s in each worker
(tests/reward_fixtures_slow_load.py) and the deadline is 1 s: every good item must still be scored."""
from __future__ import annotations

import pytest

from rlfleet.types import ScoreItem
from services.reward.isolation import IsolatedScorer
from tests.reward_fixtures_slow_load import LOAD_S

pytestmark = [pytest.mark.service, pytest.mark.timeout(180)]

DEADLINE_S = LOAD_S / 2


def test_a_fresh_pools_start_up_is_not_counted_against_its_first_items():
    scorer = IsolatedScorer("tests.reward_fixtures_slow_load:score", workers=2, item_timeout_s=DEADLINE_S)
    try:
        results = scorer.score([ScoreItem("a", "custom", "p", "1", "1"),
                                ScoreItem("b", "custom", "p", "2", "1")])
        assert [(r.ok, r.score) for r in results] == [(True, 1.0), (True, 0.0)], results
    finally:
        scorer.close()


def test_the_pool_that_replaces_a_stuck_one_is_started_before_the_rest_are_scored():
    scorer = IsolatedScorer("tests.reward_fixtures_slow_load:score", workers=1, item_timeout_s=DEADLINE_S)
    try:
        scorer.start()  # started as the reward service starts it
        # one worker: "ok" waits behind "hang", which times out; "ok" is then scored in a fresh pool
        results = scorer.score([ScoreItem("h", "custom", "p", "x", "hang"),
                                ScoreItem("ok", "custom", "p", "1", "1")])
        assert not results[0].ok and f"no reward within {DEADLINE_S:g}s" in results[0].error
        assert results[1].ok and results[1].score == 1.0, results[1]
    finally:
        scorer.close()
