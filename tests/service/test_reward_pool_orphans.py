"""The reward service's scoring workers (services/reward/isolation.py) end with the service: a reward
service killed, or one that exits without closing its pool, leaves no orphaned worker behind (before,
two spawned workers per reward service stayed under init for good)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.service

SERVICE = """
import os
from rlfleet.types import ScoreItem
from services.reward.isolation import IsolatedScorer
scorer = IsolatedScorer("gsm8k", workers=2, item_timeout_s=30)
print(scorer.score([ScoreItem("a", "openai/gsm8k", "q", "#### 4", "4")])[0].score, flush=True)
print(" ".join(str(pid) for pid in scorer._pool._processes), flush=True)
os._exit(0)  # as a killed service: no close(), no interpreter teardown
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is dead, only not reaped yet
        return stat.read().split(")")[1].split()[0] != "Z"


def test_scoring_workers_end_when_the_reward_service_is_gone() -> None:
    proc = subprocess.run([sys.executable, "-c", SERVICE], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    score, pids = proc.stdout.splitlines()[:2]
    assert float(score) == 1.0
    workers = [int(pid) for pid in pids.split()]
    assert workers, "no worker process was started"
    deadline = time.monotonic() + 60  # they notice within a second or so; orphans live on for good
    while time.monotonic() < deadline and any(_alive(pid) for pid in workers):
        time.sleep(0.2)
    assert not [pid for pid in workers if _alive(pid)], "scoring workers outlived their reward service"
