"""A reward function whose module takes 2 s to load in a worker process, as one that loads a model or a
large table does (or as any worker does on a loaded machine): `tests.reward_fixtures_slow_load:score`."""
from __future__ import annotations

import multiprocessing
import time

LOAD_S = 2.0
if multiprocessing.parent_process() is not None:  # in a worker, not in the test's own process
    time.sleep(LOAD_S)


def score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """Ground truth "hang" never returns."""
    if ground_truth == "hang":
        time.sleep(3600)
    return float(solution_str == ground_truth)
