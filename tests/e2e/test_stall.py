"""A run that trains no step stops with one line naming why (issue 42): real services, the tiny model, a
real environment server that cannot make a group trainable, and a short controller.max_stall_s.

* An OpenEnv server that admits one session at once (max_concurrent_envs=1) while a group needs
  rollout.n sessions: every group is dropped, each answered episode reset the failure budget, and the
  run spun for ever (14,000 failed episodes and 19.7 MB of samples in 240 s).
* A hung gRPC environment (Step never answers): every episode times out; at the defaults the run was
  not stopped within 300 s.
* An environment killed mid-run: the outage stop left `checkpoints/` empty while `rlfleet status` said
  controller.resume=latest continues the run (issue 42, 7)."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.e2e.conftest import REPO, read_jsonl, rlfleet
from tests.e2e.stream_lines import StreamLines
from tests.e2e.test_env_failures import error_line
from tests.e2e.test_external_reward import start_server, stop_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]
STALL_S = 20
RUN = ["controller.max_steps=3", "controller.prompts_per_step=2", "rollout.n=4", "rollout.max_turns=2",
       f"controller.max_stall_s={STALL_S}"]


def test_an_openenv_server_at_capacity_stops_the_run_naming_its_sessions(run_dir, tmp_path):
    log = open(tmp_path / "server.log", "w")
    server = subprocess.Popen([sys.executable, "-m", "tests.openenv_servers", "digits",
                               "--max-sessions", "1"], cwd=REPO, stdout=subprocess.PIPE, stderr=log,
                              text=True)
    try:
        line = server.stdout.readline()
        assert line.startswith("serving on "), (tmp_path / "server.log").read_text()[-2000:]
        address = line.split("serving on ", 1)[1].strip()
        started = time.monotonic()
        run = rlfleet("run", f"run.output_dir={run_dir}", "run.name=capacity", *RUN, "env.kind=openenv",
                      f"env.address={address}", timeout=300)
        took = time.monotonic() - started
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
    assert run.returncode == 2, run.stderr[-3000:]
    line = error_line(run.stderr)
    assert "no step trained for " in line and f"controller.max_stall_s={STALL_S}" in line, line
    assert "unusable" in line and "episode_error" in line, line
    assert "1/1 sessions" in line and "rollout.n=4" in line, line  # the server's capacity, a group's need
    assert "Traceback" not in run.stderr
    print(f"stopped {took:.0f}s after the start: {line}")
    # dropped samples are written at a bounded rate (64 a minute), not every failed episode
    samples = read_jsonl(run_dir / "capacity" / "samples" / "train.jsonl")
    assert 0 < len(samples) <= 64 * (1 + int(took // 60)), len(samples)
    # nothing was trained, so nothing can be resumed: status does not promise it
    status = rlfleet("status", str(run_dir / "capacity"))
    assert "controller.resume=latest continues" not in status.stdout, status.stdout


def test_a_hung_environment_stops_the_run_within_max_stall_s(run_dir):
    proc, address = start_server([sys.executable, "-m", "tests.env_servers", "--fault", "hang",
                                  "--port", "0"], REPO, "serving on ")
    try:
        started = time.monotonic()
        run = rlfleet("run", f"run.output_dir={run_dir}", "run.name=hung", *RUN, f"env.address={address}",
                      "env.timeout_s=2", "env.tools_in_prompt=false", timeout=300)
        took = time.monotonic() - started
    finally:
        stop_server(proc)
    assert run.returncode == 2, run.stderr[-3000:]
    line = error_line(run.stderr)
    assert "no step trained for " in line and "environment episodes failed: timeout" in line, line
    assert "Traceback" not in run.stderr
    print(f"stopped {took:.0f}s after the start: {line}")


def test_an_environment_outage_stop_checkpoints_the_last_step_and_status_names_it(run_dir):
    proc, address = start_server([sys.executable, "-m", "tests.env_servers", "--fault", "honest",
                                  "--port", "0"], REPO, "serving on ")
    out = run_dir / "outage"
    cmd = [sys.executable, "-m", "rlfleet.app.cli", "run", f"run.output_dir={run_dir}", "run.name=outage",
           "controller.max_steps=200", "controller.prompts_per_step=2", "rollout.n=4", "rollout.max_turns=2",
           f"env.address={address}", "env.tools_in_prompt=false", "env.max_outage_s=3"]
    run = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err, _ = StreamLines(run.stderr), StreamLines(run.stdout)  # both drained while it runs
    try:
        deadline = time.monotonic() + 240
        metrics = out / "metrics.jsonl"
        while time.monotonic() < deadline and not (metrics.is_file() and metrics.read_text().strip()):
            assert run.poll() is None, err.text[-3000:]
            time.sleep(0.2)
        proc.kill()  # the environment is gone for good: every call UNAVAILABLE
        proc.wait(timeout=30)
        run.wait(timeout=240)
        stderr = err.rest()
    finally:
        if run.poll() is None:
            run.kill()
        stop_server(proc)
    assert run.returncode == 2, stderr[-3000:]
    assert "no environment for" in error_line(stderr) and "Traceback" not in stderr
    last = max(m["step"] for m in read_jsonl(out / "metrics.jsonl"))
    assert (out / "checkpoints" / f"step_{last}" / "meta.json").is_file(), stderr[-3000:]
    assert (out / "controller_state" / f"step_{last}.json").is_file()
    status = rlfleet("status", str(out))
    assert f"controller.resume=latest continues it from step {last}" in status.stdout, status.stdout
