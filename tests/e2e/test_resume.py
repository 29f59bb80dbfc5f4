"""Checkpoint and resume: a synchronous run stopped after K steps and resumed reproduces the
uninterrupted run exactly (CPU, fixed seeds), and its journal loses and repeats no prompt."""
from __future__ import annotations

import signal

import pytest

from controller.journal import audit
from tests.e2e.conftest import read_jsonl, rlfleet
from tests.e2e.test_lifecycle import _exit_code, _long_run, _wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SMALL = ("controller.max_staleness=0", "controller.prompts_per_step=4", "controller.prompts_per_request=4",
         "rollout.n=4", "tracking.tensorboard=false")
COMPARED = ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "reward/mean", "response_length/mean")


@pytest.mark.parametrize("plane", ["inline", "flight"])  # flight: the tokens on the data plane (issue 44)
def test_stopped_and_resumed_run_reproduces_the_uninterrupted_one(run_dir, plane):
    n, k = 4, 2
    small = (*SMALL, f"controller.data_plane={plane}")
    full = rlfleet("run", f"run.output_dir={run_dir}", "run.name=full", f"controller.max_steps={n}", *small)
    assert full.returncode == 0, full.stderr[-3000:]
    first = rlfleet("run", f"run.output_dir={run_dir}", "run.name=resumed",
                    f"controller.max_steps={k}", *small)
    assert first.returncode == 0, first.stderr[-3000:]
    again = rlfleet("run", f"run.output_dir={run_dir}", "run.name=resumed", f"controller.max_steps={n}",
                    "controller.resume=latest", *small)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"step    {k + 1}/{n}" in again.stdout and "step    1/" not in again.stdout, again.stdout

    expected = read_jsonl(run_dir / "full" / "metrics.jsonl")
    got = read_jsonl(run_dir / "resumed" / "metrics.jsonl")
    assert [m["step"] for m in got] == list(range(1, n + 1))  # numbering continues in the same file
    assert [m["policy_version"] for m in got] == list(range(n))
    for key in COMPARED:  # bit for bit, not approximately
        assert [m[key] for m in got] == [m[key] for m in expected], key
    assert any(m["actor/grad_norm"] != expected[0]["actor/grad_norm"] for m in expected[1:])  # the runs moved

    # The resumed learner continued from step k's checkpoint: the final weights are the same.
    for name in ("full", "resumed"):
        assert (run_dir / name / "checkpoints" / f"step_{n}" / "model.safetensors").is_file()
    assert ((run_dir / "full" / "checkpoints" / f"step_{n}" / "model.safetensors").read_bytes()
            == (run_dir / "resumed" / "checkpoints" / f"step_{n}" / "model.safetensors").read_bytes())
    assert (run_dir / "resumed" / "controller_state" / f"step_{k}.json").is_file()

    # Journal: the prompts in flight at the stop were re-queued and trained once after the resume.
    events = read_jsonl(run_dir / "resumed" / "journal" / "prompts.jsonl")
    [resumed] = [e for e in events if e["event"] == "resumed"]
    assert resumed["step"] == k and resumed["requeued"] > 0
    stopped = {e["seq"] for e in events if e["event"] == "requeued" and e["reason"] == "stopped"}
    later = {e["seq"] for e in events[events.index(resumed):] if e["event"] == "trained"}
    assert stopped and stopped <= later | {e["seq"] for e in events[events.index(resumed):]
                                           if e["event"] == "requeued"}
    result = audit(run_dir / "resumed" / "journal" / "prompts.jsonl")
    assert result.lost == [] and result.trained_twice == []
    assert sum(result.trained.values()) == n * 4
    trained = sorted(e["seq"] for e in read_jsonl(run_dir / "full" / "journal" / "prompts.jsonl")
                     if e["event"] == "trained")
    assert sorted(result.trained) == trained  # the same prompts, in the same steps


def test_resume_without_a_checkpoint_is_a_clear_error(run_dir):
    proc = rlfleet("run", f"run.output_dir={run_dir}", "run.name=empty", "controller.resume=latest",
                   timeout=120)
    assert proc.returncode == 2
    assert "nothing to resume" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]


def test_a_default_run_stopped_with_ctrl_c_resumes_from_the_step_it_stopped_at(run_dir):
    """learner.checkpoint_every=0 (the default): the stop itself writes the checkpoint."""
    run = run_dir / "stopped"
    with _long_run(run_dir, "stopped", "tracking.tensorboard=false") as (proc, _):
        _wait_for(lambda: len(read_jsonl(run / "metrics.jsonl")) >= 2, 180, "a second step")
        proc.send_signal(signal.SIGINT)
        assert _exit_code(proc, 120) == 130
        err = proc.stderr.read()
    stopped_at = read_jsonl(run / "metrics.jsonl")[-1]["step"]
    assert f"stopped after step {stopped_at}; checkpoint written" in err, err[-3000:]
    assert (run / "checkpoints" / f"step_{stopped_at}" / "meta.json").is_file()
    assert (run / "controller_state" / f"step_{stopped_at}.json").is_file()

    n = stopped_at + 2
    again = rlfleet("run", f"run.output_dir={run_dir}", "run.name=stopped", f"controller.max_steps={n}",
                    "controller.resume=latest", "tracking.tensorboard=false", timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"step {stopped_at + 1:>4}/{n}" in again.stdout and "step    1/" not in again.stdout, again.stdout
    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, n + 1))
    assert [m["policy_version"] for m in metrics] == list(range(n))  # the learner went on from its version
    result = audit(run / "journal" / "prompts.jsonl")
    assert result.lost == [] and result.trained_twice == []
