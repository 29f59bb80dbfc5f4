"""A multi-turn run is observable while it trains (issue 32): `rlfleet status` lists the environment
server with its episodes and failures, the environment's own metrics (StepResult.metrics: the digits
game reports `tries` and `solved`) appear as env/<name> in the controller's Prometheus /metrics,
metrics.jsonl and TensorBoard. A short CPU run of the tiny model against the built-in digits game,
stopped with SIGINT once the checks are done (so no check races the run's end)."""
from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from rlfleet.app.cli import main as cli_main
from tests.e2e.conftest import REPO, read_jsonl
from tests.e2e.test_observability import scrape, steps_done, value, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]


def test_environment_metrics_and_status_during_a_run(run_dir, tmp_path, capsys):
    out = run_dir / "envobs"
    stderr = tmp_path / "run.err"
    cmd = [sys.executable, "-m", "rlfleet.app.cli", "run", f"run.output_dir={run_dir}", "run.name=envobs",
           "controller.max_steps=500", "controller.prompts_per_step=2", "rollout.n=4",
           "env.name=digits_game", "rollout.max_turns=2"]
    with open(stderr, "w") as se:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=se)
    try:
        wait_for(lambda: steps_done(out / "metrics.jsonl") >= 2, proc, stderr)
        controller = json.loads((out / "services" / "controller.json").read_text())
        scraped = scrape(controller["metrics_port"])
        code = cli_main(["status", str(out)])
        status_out = capsys.readouterr().out
    finally:
        proc.send_signal(signal.SIGINT)  # stops cleanly after checkpointing the last step
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert ("rlfleet_train_metric", (("metric", "env/tries"),)) in scraped
    assert 1.0 <= value(scraped, "rlfleet_train_metric", metric="env/tries") <= 2.0
    assert code == 0, status_out
    env_row = next(line for line in status_out.splitlines() if line.startswith("env "))
    env_address = json.loads((out / "services" / "env.json").read_text())["address"]
    assert env_address in env_row and "SERVING" in env_row and " episodes, 0 failed" in env_row, env_row
    lines = read_jsonl(out / "metrics.jsonl")
    assert lines and all(1.0 <= m["env/tries"] <= 2.0 and 0.0 <= m["env/solved"] <= 1.0 for m in lines)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = EventAccumulator(str(out / "tensorboard"))
    tb.Reload()
    assert {"env/tries", "env/solved"} <= set(tb.Tags()["scalars"])
    samples = read_jsonl(out / "samples" / "train.jsonl")
    reported = [s for s in samples if "env_metrics" in s]
    assert reported and all(s["env_metrics"]["tries"] == len(s["turns"]) for s in reported)
