"""Where reward functions run (services/reward/placement.py): bounded built-ins in the reward service's
process, everything else in the worker pool, which starts with the service, not at the first call."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlfleet.config import RewardConfig
from rlfleet.types import ScoreItem
from services.reward.build import build_own_scorer

pytestmark = pytest.mark.service


def children() -> set[int]:
    """This process's live child processes (the pool's workers, multiprocessing's helper)."""
    me, out = os.getpid(), set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[1]) == me and fields[0] != "Z":
                out.add(int(entry.name))
    return out


def settled_children(quiet_s: float = 1.0, limit_s: float = 60.0) -> set[int]:
    """children() once it has not changed for `quiet_s`: an earlier test's pool (a replaced worker
    of a hung item, say) may still be starting or ending processes when the next test begins."""
    import time

    last, since, deadline = children(), time.monotonic(), time.monotonic() + limit_s
    while time.monotonic() - since < quiet_s and time.monotonic() < deadline:
        time.sleep(0.1)
        now = children()
        if now != last:
            last, since = now, time.monotonic()
    return last


def digits_item(i: str, response: str = "4321", truth: str = "4321") -> ScoreItem:
    return ScoreItem(i, "digits_reverse", "Reverse the digits: 1234", response, truth)


def test_the_default_built_in_rule_scores_in_process_and_starts_no_worker():
    before = settled_children()
    scorer = build_own_scorer(RewardConfig())  # reward.fn=auto, fn_isolation=auto
    try:
        results = scorer.score([digits_item("a"), digits_item("b", response="1234")])
        assert [r.ok for r in results] == [True, True] and results[0].score == 1.0 > results[1].score
        assert not scorer.pool_started and children() == before
    finally:
        scorer.close()


def test_a_user_function_is_isolated_by_default_and_its_pool_starts_with_the_service():
    before = children()
    scorer = build_own_scorer(RewardConfig(fn="tests.reward_fixtures:score", fn_workers=2))
    try:
        assert scorer.pool_started and len(children() - before) >= 2  # up before any call
        item = ScoreItem("x", "custom", "p", "7", "7")
        assert scorer.score([item])[0].score == 1.0
    finally:
        scorer.close()


def test_a_hanging_user_function_fails_its_item_alone_in_the_pool():
    scorer = build_own_scorer(RewardConfig(fn="tests.reward_fixtures:hang_or_crash", fn_timeout_s=2.0))
    try:
        results = scorer.score([ScoreItem("h", "custom", "p", "x", "hang"),
                                ScoreItem("ok", "custom", "p", "1", "1")])
        assert not results[0].ok and "no reward within 2s" in results[0].error
        assert results[1].ok and results[1].score == 1.0
    finally:
        scorer.close()


def test_a_function_marked_safe_scores_in_process():
    before = settled_children()
    scorer = build_own_scorer(RewardConfig(fn="tests.reward_fixtures:score", fn_isolation="none"))
    try:
        assert scorer.score([ScoreItem("x", "custom", "p", "7", "7")])[0].score == 1.0
        assert not scorer.pool_started and children() == before
    finally:
        scorer.close()


def test_isolation_process_puts_even_built_in_rules_in_the_pool():
    scorer = build_own_scorer(RewardConfig(fn_isolation="process", fn_workers=1))
    try:
        assert scorer.pool_started
        assert scorer.score([digits_item("a")])[0].score == 1.0
    finally:
        scorer.close()


def test_under_auto_an_unbounded_built_in_gets_the_pool_when_its_first_item_arrives():
    scorer = build_own_scorer(RewardConfig(fn_workers=1))
    try:
        assert not scorer.pool_started
        results = scorer.score([digits_item("d"), ScoreItem("m", "math", "p", "\\boxed{1/2}", "0.5")])
        assert [r.score for r in results] == [1.0, 1.0] and scorer.pool_started
    finally:
        scorer.close()


def test_a_bad_isolation_value_names_the_key():
    with pytest.raises(ValueError, match="fn_isolation"):
        RewardConfig(fn_isolation="sometimes")
