"""`reward.sources` function sources score each item with a deadline in worker processes, as
`reward.fn` does (issue 22): a hanging item fails alone, the items beside it keep their rewards,
and the worker stuck in it is ended (the pool is replaced through public API only)."""
from __future__ import annotations

import os
import time

import pytest

from rlfleet.reward_config import RewardSourceConfig
from rlfleet.types import ScoreItem
from services.reward.sources import build_sources

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_a_hanging_item_of_a_function_source_fails_alone_and_its_worker_is_ended(tmp_path):
    pid_file = tmp_path / "pid"
    cfg = RewardSourceConfig(name="rule", function="tests.reward_fixtures:hang_and_tell", timeout_s=60)
    sources = build_sources([cfg], own_scorer=lambda: None, own="reward.fn auto", fn_workers=2,
                            fn_timeout_s=3.0)
    items = [ScoreItem("a", "digits", "p", "1", "1"),
             ScoreItem("h", "digits", "p", "x", "hang", extra_info={"pid_file": str(pid_file)}),
             ScoreItem("b", "digits", "p", "2", "1")]
    try:
        began = time.monotonic()
        results = {r.id: r for r in sources.score(items)}
        assert time.monotonic() - began < 30
        assert results["a"].ok and results["a"].score == 1.0, results["a"]
        assert results["b"].ok and results["b"].score == 0.0, results["b"]
        assert not results["h"].ok and "no reward within 3s" in results["h"].error, results["h"]
        stuck = int(pid_file.read_text())
        deadline = time.monotonic() + 60  # killed at once; a leak lives on for good
        while _alive(stuck) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(stuck), "the worker stuck in the hanging item lives on"
        again = sources.score([ScoreItem("c", "digits", "p", "7", "7")])
        assert again[0].ok and again[0].score == 1.0  # a fresh pool serves
    finally:
        sources.close()
