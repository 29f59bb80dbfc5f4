"""External reward servers as separate processes: training on one, and the conformance check.

The training run gets its reward only from a reward server started here as its
own process (the SDK serving the built-in digits reward), which the reward service
`rlfleet run` starts calls as its only source. The Node.js example server is checked with `rlfleet reward
check`; npm installs its two packages first (skipped only where node/npm are absent).
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlfleet.proto.v1 import common_pb2, reward_pb2_grpc
from rlfleet.rpc.channel import open_channel
from tests.e2e.stream_lines import StreamLines
from tests.e2e.conftest import REPO, read_jsonl, rlfleet
from tests.reward_servers import Behaviour, RunningFaulty

pytestmark = pytest.mark.e2e

NODE_EXAMPLE = REPO / "examples" / "reward-server-node"


def start_server(cmd: list[str], cwd: Path, marker: str,
                 timeout_s: float = 60) -> tuple[subprocess.Popen, str]:
    """Starts a server process that prints `<marker>HOST:PORT` once it serves."""
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if marker in line:
            return proc, line.split(marker, 1)[1].strip()
        if not line and proc.poll() is not None:
            break
    stop_server(proc)
    raise RuntimeError(f"{cmd} did not start: {proc.stderr.read()[-2000:]}")


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def sdk_digits_server() -> Iterator[str]:
    proc, address = start_server([sys.executable, "-m", "rlfleet.app.cli", "reward", "serve", "digits",
                                  "--port", "0"],
                                 REPO, "serving on ")
    yield address
    stop_server(proc)


@pytest.fixture(scope="session")
def node_example() -> Path:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are needed for the Node.js example reward server")
    if not (NODE_EXAMPLE / "node_modules" / "@grpc" / "grpc-js").is_dir():
        proc = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(NODE_EXAMPLE)],
                              capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 0, f"npm install failed: {proc.stderr[-2000:]}"
    return NODE_EXAMPLE


@pytest.mark.slow
def test_training_rewarded_only_by_an_external_server(run_dir, sdk_digits_server):
    steps = 20
    proc = rlfleet("run", f"run.output_dir={run_dir}", "run.name=external", f"controller.max_steps={steps}",
                   f"reward.sources=[{{name: ext, address: '{sdk_digits_server}', weight: 1.0}}]")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = run_dir / "external"
    # The reward service composes reward.sources: it calls the external server, the controller calls it.
    assert (out / "services" / "reward.json").exists()
    lines = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in lines] == list(range(1, steps + 1))
    for m in lines:
        assert m["reward/ext/mean"] == pytest.approx(m["reward/mean"])
        assert m["reward/excluded_total"] == 0 and m["reward/ext/errors"] == 0
        assert m["reward/ext/circuit_open"] == 0
    assert lines[-1]["reward/ext/calls"] >= steps * 8 / 64  # at least one call per step's groups
    rewards = [m["reward/mean"] for m in lines]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last - first >= 0.15, f"reward went from {first:.3f} to {last:.3f}: {rewards}"
    # Every trained sample's reward came from the external server, which counts what it scored.
    channel = open_channel(sdk_digits_server)
    try:
        status = reward_pb2_grpc.RewardStub(channel).GetStatus(common_pb2.GetStatusRequest(), timeout=10)
    finally:
        channel.close()
    assert status.stats["scored"] >= steps * 8 * 8
    print("reward/mean per step:", " ".join(f"{r:.3f}" for r in rewards))


def test_node_example_passes_the_conformance_check(node_example):
    proc, address = start_server(["node", "server.js", "--port", "0"], node_example, "serving on ")
    try:
        check = rlfleet("reward", "check", address, timeout=120)
        assert check.returncode == 0, check.stdout + check.stderr
        assert "0 FAIL" in check.stdout and "health" in check.stdout
        digits = rlfleet("reward", "check", address, "--item",
                         '{"data_source": "digits_reverse", "response": "4321", "ground_truth": "4321"}',
                         timeout=120)
        assert digits.returncode == 0, digits.stdout
    finally:
        stop_server(proc)


@pytest.mark.slow
def test_short_run_rewarded_by_the_node_server(run_dir, node_example):
    proc, address = start_server(["node", "server.js", "--port", "0"], node_example, "serving on ")
    try:
        run = rlfleet("run", f"run.output_dir={run_dir}", "run.name=node", "controller.max_steps=4",
                      f"reward.sources=[{{name: node, address: '{address}'}}]")
    finally:
        stop_server(proc)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = read_jsonl(run_dir / "node" / "metrics.jsonl")
    assert len(lines) == 4 and all(m["reward/excluded_total"] == 0 for m in lines)
    assert all(0.0 < m["reward/node/mean"] == pytest.approx(m["reward/mean"]) for m in lines)


def serve_digits(port: int = 0) -> tuple[subprocess.Popen, str]:
    return start_server([sys.executable, "-m", "rlfleet.app.cli", "reward", "serve", "digits", "--port",
                         str(port)], REPO, "serving on ")


def start_run(run_dir: Path, name: str, address: str, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "rlfleet.app.cli", "run", f"run.output_dir={run_dir}", f"run.name={name}",
         f"reward.sources=[{{name: ext, address: '{address}'}}]", *overrides],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_steps(run: subprocess.Popen, metrics: Path, steps: int, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and run.poll() is None:
        if metrics.exists() and len(read_jsonl(metrics)) >= steps:
            return
        time.sleep(0.2)
    raise AssertionError(f"the run did not reach step {steps}")


@pytest.mark.slow
def test_reward_server_killed_and_back_10s_later_does_not_end_a_default_run(run_dir):
    server, address = serve_digits()
    metrics = run_dir / "back" / "metrics.jsonl"
    run = start_run(run_dir, "back", address, "controller.max_steps=8")
    err, _ = StreamLines(run.stderr), StreamLines(run.stdout)  # both drained while it runs
    try:
        wait_for_steps(run, metrics, 2)
        server.kill()  # kill -9: no goodbye
        server.wait()
        time.sleep(10)
        # down at least 10 s, and until the run has noticed (a loaded machine may score nothing for a while)
        err.wait_for("reward outage:", 240, alive=lambda: run.poll() is None)
        server, _ = serve_digits(int(address.rsplit(":", 1)[1]))
        run.wait(timeout=300)
        stderr = err.rest()
    finally:
        stop_server(server)
        stop_server(run)
    assert run.returncode == 0, stderr[-3000:]
    assert stderr.count("reward outage:") == 1 and stderr.count("reward outage over") == 1, stderr[-3000:]
    assert "rollout_failed" not in stderr and "CANCELLED" not in stderr, stderr[-3000:]
    lines = read_jsonl(metrics)
    assert len(lines) == 8 and all(m["reward/excluded_total"] == 0 for m in lines)


@pytest.mark.slow
def test_reward_server_that_stays_down_ends_the_run_after_max_outage_naming_the_cause(run_dir):
    server, address = serve_digits()
    metrics = run_dir / "dies" / "metrics.jsonl"
    # The controller asks again 0.5, 1, 2, 4, then every 5 s: a 4 s limit ends the run at its 5th ask
    # (~7.5 s after the kill), 8 s only at its 6th (~12.5 s).
    run = start_run(run_dir, "dies", address, "controller.max_steps=40", "reward.max_outage_s=4")
    try:
        wait_for_steps(run, metrics, 2)
        killed = time.monotonic()  # before the stop: the outage cannot begin earlier
        stop_server(server)
        _, stderr = run.communicate(timeout=240)
        waited = time.monotonic() - killed
    finally:
        stop_server(server)
        stop_server(run)
    assert run.returncode != 0
    assert "Traceback" not in stderr, stderr[-3000:]
    error = stderr.strip().splitlines()[-1]
    assert "reward.max_outage_s=4" in error and f"'ext' at {address}" in error, stderr[-3000:]
    assert "refused" in error.lower(), error  # the root cause, not only "circuit open"
    assert "samples in a row got no reward" not in stderr
    assert 4 <= waited < 60, waited
    lines = read_jsonl(metrics)
    assert 2 <= len(lines) < 40
    assert all(m["reward/excluded_total"] == 0 for m in lines)  # refused samples were never counted


def test_check_command_fails_a_broken_server():
    server = RunningFaulty(Behaviour(drop_last=True))
    try:
        check = rlfleet("reward", "check", server.address, "--timeout", "5", timeout=120)
    finally:
        server.stop()
    assert check.returncode == 1
    row = next(line for line in check.stdout.splitlines() if line.startswith("batch keeps order"))
    assert "FAIL" in row and "15 results for 16 items" in row
