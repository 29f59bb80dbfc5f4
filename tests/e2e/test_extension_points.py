"""A rollout engine added in its own module (one registration, loaded by `algorithm.plugins`) is served
by `rlfleet serve rollout`, a real process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlfleet.proto.v1 import common_pb2, rollout_pb2, rollout_pb2_grpc
from rlfleet.rpc.channel import wait_until_serving
from tests.e2e.conftest import REPO, rlfleet
from tests.unit.test_extension_points import ENGINE_PLUGIN

pytestmark = pytest.mark.e2e


def test_rlfleet_serve_rollout_serves_a_plugin_engine(tmp_path: Path) -> None:
    (tmp_path / "my_engines.py").write_text(ENGINE_PLUGIN)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    config = ["algorithm.plugins=[my_engines]", "rollout.backend=test_greedy"]

    # Without the plugin the name is unknown: a one-line config error naming the key.
    refused = rlfleet("serve", "rollout", "rollout.backend=test_greedy", timeout=120, env=env)
    assert refused.returncode != 0
    assert "rollout.backend = 'test_greedy': Value error, unknown rollout engine 'test_greedy'; " \
           "registered: hf, vllm" in refused.stderr
    assert "Traceback" not in refused.stderr

    announced = tmp_path / "runs" / "plug" / "services" / "rollout.json"
    proc = subprocess.Popen([sys.executable, "-m", "rlfleet.app.cli", "serve", "rollout",
                             f"run.output_dir={tmp_path / 'runs'}", "run.name=plug", *config],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not announced.exists():
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "the rollout service did not announce itself"
            time.sleep(0.2)
        address = json.loads(announced.read_text())["address"]
        channel = wait_until_serving(address, "rollout", 120, alive=lambda: proc.poll() is None)
        request = rollout_pb2.GenerateRequest(
            prompts=[rollout_pb2.PromptInput(request_id="a", prompt_ids=[6, 7, 8])],
            params=common_pb2.SamplingParams(n=4, temperature=1.0, max_new_tokens=6, seed=1))
        (group,) = list(rollout_pb2_grpc.RolloutStub(channel).Generate(request, timeout=60))
        channel.close()
        # At temperature 1 the hf engine's four samples differ; the plugin's engine is greedy.
        assert len(group.completions) == 4
        assert len({tuple(c.token_ids) for c in group.completions}) == 1
    finally:
        proc.terminate()
        proc.wait(timeout=30)
