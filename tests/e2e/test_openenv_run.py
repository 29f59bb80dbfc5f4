"""`rlfleet run` against an OpenEnv server (env.kind=openenv): the digits game written with openenv-core's
server helpers (tests/openenv_servers.py), in a process of its own, 3 training steps of the embedded tiny
model with multi-turn episodes, one WebSocket session per episode."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.e2e.conftest import REPO, read_jsonl, rlfleet

pytestmark = [pytest.mark.e2e]


def test_tiny_model_trains_three_steps_against_an_openenv_server(run_dir, tmp_path):
    log = open(tmp_path / "server.log", "w")
    server = subprocess.Popen([sys.executable, "-m", "tests.openenv_servers", "digits"], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        line = server.stdout.readline()
        assert line.startswith("serving on "), (tmp_path / "server.log").read_text()[-2000:]
        address = line.split("serving on ", 1)[1].strip()
        started = time.monotonic()
        proc = rlfleet("run", f"run.output_dir={run_dir}", "run.name=openenv", "controller.max_steps=3",
                       "env.kind=openenv", f"env.address={address}", "rollout.max_turns=2")
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = run_dir / "openenv"
    lines = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in lines] == [1, 2, 3], f"{time.monotonic() - started:.0f}s"
    for m in lines:
        assert m["env/episodes"] == 64 and m["env/failed"] == 0 and m["env/with_env_reward"] == 64
        assert 1.0 <= m["env/turns_mean"] <= 2.0 and m["env/observed_tokens"] >= 0
    assert sum(m["env/turns_max"] == 2 for m in lines) >= 1, "no step had a multi-turn episode"
    samples = read_jsonl(out / "samples" / "train.jsonl")
    two_turns = [s for s in samples if len(s["turns"]) == 2]
    assert two_turns, "no episode took a second turn"
    assert "Reverse the digits: " in two_turns[0]["turns"][0]["observation"]  # the server's feedback
    assert all(s["reward"] == s["env_reward"] for s in samples)
    multi_turn = sum(len(s["turns"]) == 2 for s in samples)
    print(f"multi-turn episodes: {multi_turn} of {len(samples)}")
