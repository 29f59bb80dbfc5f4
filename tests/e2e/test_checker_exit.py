"""`rlfleet reward check` and `rlfleet env check` exit when done, also under CPU load.

Issue 32: against a server without reflection the reward check printed its whole table and then, under
load, sometimes never exited (13 hangs in 253 runs against the Node.js example): a refused reflection
stream was left for the interpreter's final garbage collection, where grpc's call finaliser deadlocked.
tests/service/test_checker_releases_calls.py checks the cause deterministically (no call left alive);
this runs the real commands many times, a few at a time, next to CPU burners, and requires every run to
exit, with its table, within a bound far above a normal run (a few seconds here).
"""
from __future__ import annotations

import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.e2e.conftest import REPO
from tests.plain_servers import server_without_reflection

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RUNS = 8  # per checker: a guard; tests/service/test_checker_releases_calls.py checks the cause every time
AT_ONCE = 4
BURNERS = 2
BOUND_S = 90.0


def check_once(kind: str) -> tuple[str, str]:
    """('exited', 'hung' or 'exit N', what it printed). A server of its own for each run: `env check`
    names its episodes check-1, check-2, … in every run, and leaves some running (its deadline check)."""
    with server_without_reflection(kind) as address:
        proc = subprocess.Popen([sys.executable, "-m", "rlfleet.app.cli", kind, "check", address], cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = proc.communicate(timeout=BOUND_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            return "hung", out + err[-1500:]
    return ("exited" if proc.returncode == 0 else f"exit {proc.returncode}"), out + err[-1500:]


@pytest.mark.parametrize("kind", ["reward", "env"])
def test_the_checker_exits_every_time_under_load(kind: str):
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(BURNERS)]
    try:
        with ThreadPoolExecutor(AT_ONCE) as pool:
            outcomes = list(pool.map(lambda _: check_once(kind), range(RUNS)))
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    bad = [(outcome, printed) for outcome, printed in outcomes if outcome != "exited"]
    assert not bad, f"{len(bad)} of {RUNS} `rlfleet {kind} check` runs did not exit cleanly; " \
                    f"the first:\n{bad[0][0]}\n{bad[0][1]}"
    for _, printed in outcomes:
        assert " 0 FAIL" in printed and re.search(r"reflection \(optional\) +N/A", printed), printed
