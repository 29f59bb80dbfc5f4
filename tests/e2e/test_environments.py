"""Multi-turn training end to end: `rlfleet run` with an environment server as a process of its own
(the built-in digits game on the embedded tiny model), the Node.js environment example against the
conformance check, and an environment server killed in the middle of a run."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import REPO, read_jsonl, rlfleet
from tests.e2e.test_external_reward import start_server, stop_server

pytestmark = [pytest.mark.e2e]
NODE_EXAMPLE = REPO / "examples" / "env-server-node"
GAME = ["env.name=digits_game", "rollout.max_turns=2"]


@pytest.mark.slow
def test_tiny_model_learns_the_multi_turn_game(run_dir, tmp_path):
    val = tmp_path / "val.parquet"
    assert rlfleet("data", "digits-reverse", "--output", str(val), "--size", "16").returncode == 0
    proc = rlfleet("run", f"run.output_dir={run_dir}", "run.name=game", "controller.max_steps=20", *GAME,
                   f"data.val_files=[{val}]", "controller.eval_every=20",
                   "controller.eval_before_train=false")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = run_dir / "game"
    lines = read_jsonl(out / "metrics.jsonl")
    rewards = [m["reward/mean"] for m in lines]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last - first >= 0.15, f"reward went from {first:.3f} to {last:.3f}: {rewards}"
    for m in lines:
        assert m["env/episodes"] == 64 and 1.0 <= m["env/turns_mean"] <= 2.0
        assert m["env/failed"] == 0 and m["env/with_env_reward"] == 64
        assert m["env/observed_tokens"] > 0 and m["env/generated_tokens"] > 0
        assert m["staleness/max"] <= 1
    samples = read_jsonl(out / "samples" / "train.jsonl")
    two_turns = [s for s in samples if len(s["turns"]) == 2]
    assert two_turns, "no episode took a second turn"
    s = two_turns[0]
    assert s["turns"][0]["observation"].endswith("<|im_start|>assistant\n")
    assert "Reverse the digits: " in s["turns"][0]["observation"]
    assert s["version"] == min(t["version"] for t in s["turns"]) and s["reward"] == s["env_reward"]
    assert s["trained_version"] - s["version"] <= 1
    # Validation plays episodes too (greedy): the responses hold the environment's turns.
    assert "val/digits_reverse/accuracy" in lines[-1]
    val_samples = read_jsonl(out / "samples" / "val.jsonl")
    assert len(val_samples) == 16
    for v in val_samples:  # right at the first try ends the episode; else the game asked again
        if "<|im_start|>user\nReverse the digits: " in v["response"]:
            assert v["response"].count("<|im_start|>assistant") == 1  # a second turn followed
        else:
            assert v["reward"] == 1.0, v
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["env"]["address"].startswith("127.0.0.1:")  # served by `rlfleet run`
    assert all(1.0 <= m["env/tries"] <= 2.0 for m in lines)  # the game's own metrics (StepResult.metrics)


@pytest.fixture
def node_example() -> Path:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are needed for the Node.js example environment server")
    if not (NODE_EXAMPLE / "node_modules" / "@grpc" / "grpc-js").is_dir():
        proc = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(NODE_EXAMPLE)],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"npm install failed: {proc.stderr[-2000:]}"
    return NODE_EXAMPLE


def test_node_example_passes_the_environment_check(node_example):
    proc, address = start_server(["node", "server.js", "--port", "0"], node_example, "serving on ")
    try:  # --stop: the last check sends it SIGTERM and watches its health say NOT_SERVING
        check = rlfleet("env", "check", address, "--stop", str(proc.pid), timeout=120)
        assert proc.wait(timeout=30) == 0  # it went, once the check was done with it
    finally:
        stop_server(proc)
    assert check.returncode == 0, check.stdout + check.stderr[-2000:]
    # reflection is the one optional part it skips; no token configured: refusal not checked
    assert "summary: 20 PASS, 0 FAIL, 2 N/A" in check.stdout, check.stdout
    assert re.search(r"reflection \(optional\) +N/A", check.stdout)
    assert re.search(r"NOT_SERVING on SIGTERM \(--stop\) +PASS", check.stdout)


def test_the_python_environment_server_says_not_serving_on_sigterm():
    proc, address = start_server([sys.executable, "-m", "rlfleet.app.cli", "env", "serve", "digits_game",
                                  "--port", "0"], REPO, "serving on ")
    try:
        check = rlfleet("env", "check", address, "--stop", str(proc.pid), timeout=120)
        proc.wait(timeout=30)
    finally:
        stop_server(proc)
    assert check.returncode == 0, check.stdout + check.stderr[-2000:]
    assert "summary: 21 PASS, 0 FAIL, 1 N/A" in check.stdout, check.stdout  # N/A: token refusal


def test_check_fails_an_environment_that_breaks_the_contract(tmp_path):
    module = tmp_path / "sloppy_env.py"
    module.write_text(
        "from rlfleet.app.env_sdk import Environment, Step\n"
        "class Sloppy(Environment):\n"
        "    def start(self, row):\n"
        "        return {}\n"
        "    def step(self, state, action):\n"
        "        return Step(observation='again')  # never done\n"
        "    def end(self, state, reason):\n"
        "        return float('inf')\n")
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    serve = [sys.executable, "-m", "rlfleet.app.cli", "env", "serve", "sloppy_env:Sloppy", "--port", "0"]
    proc = subprocess.Popen(serve, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **env})
    try:
        line = ""
        while "serving on " not in line:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, proc.stderr.read()[-2000:]
        address = line.split("serving on ", 1)[1].strip()
        check = rlfleet("env", "check", address, timeout=120)
    finally:
        stop_server(proc)
    assert check.returncode == 1
    assert "FAIL" in check.stdout and "non-finite reward" in check.stdout


@pytest.mark.slow
def test_environment_server_killed_mid_run_does_not_end_the_run(run_dir):
    """kill -9 of the environment server: `rlfleet run` restarts it on the same port; episodes caught
    by it fail ('unavailable', counted, left out), admission pauses until it answers, the run ends
    normally."""
    out = run_dir / "killed"
    cmd = [sys.executable, "-m", "rlfleet.app.cli", "run", f"run.output_dir={run_dir}", "run.name=killed",
           "controller.max_steps=14", *GAME]
    run = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not (out / "metrics.jsonl").is_file():
            time.sleep(0.2)
        pid = json.loads((out / "services" / "env.json").read_text())["pid"]
        os.kill(pid, signal.SIGKILL)
        stdout, stderr = run.communicate(timeout=400)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, stderr[-3000:]
    lines = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in lines] == list(range(1, 15))
    restarted = json.loads((out / "services" / "env.json").read_text())
    assert restarted["pid"] != pid  # a new process, at the address the rollout already had
    journal = (out / "journal" / "prompts.jsonl").read_text()
    failed = sum(m["env/failed/unavailable"] for m in lines)
    if failed:  # episodes were in flight when it died: the outage paused admission and ended
        assert '"env_outage"' in journal and '"env_back"' in journal
    assert "Traceback" not in stderr


def test_tool_environment_leaves_the_final_answer_to_the_reward_service(run_dir):
    """The calculator gives no reward: every episode's final turn is scored by the reward service
    (the tiny model never calls the tool, so each episode is its one answer turn)."""
    proc = rlfleet("run", f"run.output_dir={run_dir}", "run.name=calc", "controller.max_steps=3",
                   "env.name=calculator", "rollout.stop=['</tool>']",
                   "env.tools_in_prompt=false")  # the tools' system message does not fit the tiny model
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = read_jsonl(run_dir / "calc" / "metrics.jsonl")
    for m in lines:
        assert m["env/with_env_reward"] == 0 and m["env/turns_mean"] == 1.0 and m["env/failed"] == 0
        assert m["reward/failed"] == 0 and m["env/observed_tokens"] == 0
    samples = read_jsonl(run_dir / "calc" / "samples" / "train.jsonl")
    assert all(s["reward"] is not None and s["env_reward"] is None for s in samples)
    assert all(s["response"] == s["turns"][0]["text"] for s in samples)
