"""An environment that answers every call wrongly stops `rlfleet run` with one line naming the server,
the failure and its count, instead of looping for ever (issue 32: a run sat at step 1 for 246 s with
100,090 episodes started). Each case is a short CPU run of the tiny model against a real server
process; the run must end by itself, well within the test's bound, with exit code 2 (an error)."""
from __future__ import annotations

import sys

import pytest

from tests.e2e.conftest import REPO, read_jsonl, rlfleet
from tests.e2e.test_external_reward import start_server, stop_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]
RUN = ["controller.max_steps=3", "controller.prompts_per_step=2", "rollout.n=4", "rollout.max_turns=2",
       "env.timeout_s=5", "env.tools_in_prompt=false"]


def error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("rlfleet: error")]
    assert lines, stderr[-3000:]
    return lines[-1]


def run_against(fault: str, run_dir, *extra: str):
    proc, address = start_server([sys.executable, "-m", "tests.env_servers", "--fault", fault, "--port", "0"],
                                 REPO, "serving on ")
    try:
        return address, rlfleet("run", f"run.output_dir={run_dir}", f"run.name={fault}", *RUN,
                                f"env.address={address}", *extra, timeout=300)
    finally:
        stop_server(proc)


def test_a_non_finite_reward_on_every_step_stops_the_run(run_dir):
    address, run = run_against("nan_reward", run_dir, "env.max_consecutive_failures=16")
    assert run.returncode == 2, run.stderr[-3000:]
    line = error_line(run.stderr)
    assert f"environment {address}: 16 episodes in a row failed (invalid_reply 16;" in line, line
    assert "non-finite reward nan" in line and "Traceback" not in run.stderr
    # The failed episodes are in the samples with their error, though no step was ever trained.
    samples = read_jsonl(run_dir / "nan_reward" / "samples" / "train.jsonl")
    assert samples
    assert all(s["env_failure"] == "invalid_reply" and s["dropped"] == "unusable" for s in samples)
    assert all("non-finite reward nan" in s["env_error"] and s["reward"] is None for s in samples)


def test_unavailable_on_every_call_while_health_says_serving_stops_the_run(run_dir):
    address, run = run_against("unavailable", run_dir, "env.max_outage_s=3")
    assert run.returncode == 2, run.stderr[-3000:]
    line = error_line(run.stderr)
    assert "env.max_outage_s=3" in line and address in line and "UNAVAILABLE" in line, line
    assert "Traceback" not in run.stderr


def test_a_wrong_token_on_every_call_stops_the_run(run_dir, tmp_path):
    """The environment server refuses the run's token (UNAUTHENTICATED): with the tools off, nothing
    asks it before the episodes, which all fail."""
    tokens = {}
    for name, token in (("env", "the-environments-token-0123456789"),
                        ("run", "the-runs-own-token-9876543210")):
        tokens[name] = tmp_path / f"{name}.token"
        tokens[name].write_text(token + "\n")
        tokens[name].chmod(0o600)
    proc, address = start_server([sys.executable, "-m", "rlfleet.app.cli", "env", "serve", "digits_game",
                                  "--port", "0", f"security.token_file={tokens['env']}"], REPO, "serving on ")
    try:
        run = rlfleet("run", f"run.output_dir={run_dir}", "run.name=token", *RUN, f"env.address={address}",
                      f"security.token_file={tokens['run']}", "env.max_consecutive_failures=16", timeout=300)
    finally:
        stop_server(proc)
    assert run.returncode == 2, run.stderr[-3000:]
    line = error_line(run.stderr)
    assert f"environment {address}: 16 episodes in a row failed (rpc_error 16;" in line, line
    assert "UNAUTHENTICATED" in line and "Traceback" not in run.stderr
