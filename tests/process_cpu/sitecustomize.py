"""Loaded by every Python process that has this folder on PYTHONPATH (`make test-cpu`): at exit it appends
one JSON line to $RLFLEET_PROCESS_CPU_LOG with the process's command line, its CPU seconds, its wall
seconds, the test that started it (pytest exports PYTEST_CURRENT_TEST to the commands a test runs) and
whether it imported torch. The suite is CPU-bound on two cores, and most of its CPU is
spent in the services and commands its end-to-end tests start, which pytest's --durations cannot see.

A process that is killed (SIGKILL, or a signal it does not handle) runs no exit handler and is missing
from the log; report.py says how much of the suite's CPU the log accounts for."""
from __future__ import annotations

import atexit
import json
import os
import resource
import sys
import time

_LOG = os.environ.get("RLFLEET_PROCESS_CPU_LOG")
_STARTED = time.monotonic()


def _record() -> None:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    line = {"argv": sys.argv[:4], "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
            "wall_s": round(time.monotonic() - _STARTED, 2),
            "test": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0],
            "torch": "torch" in sys.modules,
            "pytest": "_pytest" in sys.modules}  # pytest itself or one of its xdist workers
    try:  # one short append per process: lines from concurrent processes do not interleave
        with open(_LOG, "a") as log:
            log.write(json.dumps(line) + "\n")
    except OSError:
        pass  # a measurement aid never fails the process it measures


if _LOG:
    atexit.register(_record)
