"""Reward functions loaded by import path in tests (`tests.reward_fixtures:score`).

They follow verl's signature `fn(data_source, solution_str, ground_truth, extra_info)`.
The ground truth steers failures: "raise" raises, "nan" returns NaN, "inf" returns inf.
"""
from __future__ import annotations

import math
import threading
import time


def score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    if ground_truth == "raise":
        raise ValueError("reward function exploded")
    if ground_truth == "nan":
        return math.nan
    if ground_truth == "inf":
        return math.inf
    if ground_truth == "dict":
        return {"score": 0.25, "acc": True}
    bonus = float((extra_info or {}).get("bonus", 0.0))
    return float(solution_str.strip() == ground_truth) + bonus


def sleepy(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None,
           seconds: float = 1.0) -> float:
    """Takes `seconds` to score: a reward function slower than its deadline."""
    time.sleep(seconds)
    return 1.0


RELEASED = threading.Event()


def held(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None,
         seconds: float = 60.0) -> float:
    """Takes until the test sets RELEASED (or `seconds`): a reward function slower than its deadline,
    run in the test's own process, that holds no thread once the test is done."""
    RELEASED.wait(seconds)
    return 1.0


def hang_or_crash(data_source: str, solution_str: str, ground_truth: str,
                  extra_info: dict | None = None) -> float:
    """Ground truth "hang" never returns; "crash" kills the process scoring it; else like `score`."""
    if ground_truth == "hang":
        while True:
            time.sleep(3600)
    if ground_truth == "crash":
        import os
        os._exit(3)
    return score(data_source, solution_str, ground_truth, extra_info)


def hang_and_tell(data_source: str, solution_str: str, ground_truth: str,
                  extra_info: dict | None = None) -> float:
    """Ground truth "hang" writes the scoring process's pid to extra_info["pid_file"] and never
    returns (to check that the process is ended); else like `score`."""
    if ground_truth == "hang":
        import os
        from pathlib import Path

        Path(extra_info["pid_file"]).write_text(str(os.getpid()))
        while True:
            time.sleep(3600)
    return score(data_source, solution_str, ground_truth, extra_info)


def gated(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """Like `score`, but only the first $RLFLEET_TEST_GATE_FREE items (counted across the worker
    processes, one byte each appended to $RLFLEET_TEST_GATE/calls) are scored at once; every later one
    waits until $RLFLEET_TEST_GATE/open exists: a test holds a step's Score calls, so its Train cannot
    begin, for as long as it needs (tests/e2e/test_data_plane_staging.py)."""
    import os
    from pathlib import Path

    gate = Path(os.environ["RLFLEET_TEST_GATE"])
    fd = os.open(gate / "calls", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, b".")
    finally:
        os.close(fd)
    if (gate / "calls").stat().st_size > int(os.environ["RLFLEET_TEST_GATE_FREE"]):
        while not (gate / "open").exists():
            time.sleep(0.01)
    return score(data_source, solution_str, ground_truth, extra_info)
