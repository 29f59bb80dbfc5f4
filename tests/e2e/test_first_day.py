"""The rough edges of a first day (issue 43): what a new user meets on the CPU with the tiny model."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rlfleet.cpu_threads import ENV, share_of_cores
from rlfleet.data.tasks import write_parquet
from tests.e2e.conftest import REPO, read_jsonl, rlfleet
from tests.e2e.stream_lines import StreamLines
from tests.free_ports import port_for_later

pytestmark = pytest.mark.e2e

# The digits task's rows carry their answer as the ground truth: the response column of an SFT.
SFT = ["--model", "builtin:tiny", "--response-key", "reward_model.ground_truth", "--batch-size", "4",
       "learner.device=cpu", "data.val_files=[]"]


def rlfleet_without_omp(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """The command as a user starts it: no OMP_NUM_THREADS (the suite's workers set one)."""
    env = {k: v for k, v in os.environ.items() if k != ENV}
    return subprocess.run([sys.executable, "-m", "rlfleet.app.cli", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_sft_on_the_cpu_computes_with_the_services_share_of_the_cores(tmp_path: Path) -> None:
    # torch's default (a thread per core, spinning) made an SFT step ~13x slower on a loaded 2-core
    # machine; the command takes what a service of `rlfleet run` takes: half the cores, at least one.
    train = write_parquet(tmp_path / "train.parquet", 8, seed=0, split="train")
    proc = rlfleet_without_omp("sft", "--data", str(train), "--output", str(tmp_path / "sft"), "--max-steps",
                               "1", *SFT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    threads = share_of_cores()
    assert f"1 steps of 4 on {threads} CPU thread" in proc.stdout, proc.stdout


@pytest.mark.parametrize("key, extra", [("data.train_files", []),
                                        ("data.val_files", ["controller.eval_every=5"])])
def test_a_missing_data_file_is_refused_before_the_earlier_run_is_moved_aside(tmp_path: Path, key: str,
                                                                              extra: list[str]) -> None:
    earlier = tmp_path / "outputs" / "default"
    earlier.mkdir(parents=True)
    (earlier / "metrics.jsonl").write_text('{"step": 1}\n')
    missing = tmp_path / "no-such.parquet"
    proc = rlfleet("run", f"run.output_dir={tmp_path / 'outputs'}", f"{key}=[{missing}]", *extra, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"{missing}" in proc.stderr and "does not exist" in proc.stderr, proc.stderr
    assert [p.name for p in (tmp_path / "outputs").iterdir()] == ["default"], proc.stdout
    assert (earlier / "metrics.jsonl").read_text() == '{"step": 1}\n'


def test_sft_stopped_by_ctrl_c_checkpoints_its_last_step_and_resumes_from_it(tmp_path: Path) -> None:
    train = write_parquet(tmp_path / "train.parquet", 12, seed=0, split="train")
    out = tmp_path / "sft"
    proc = subprocess.Popen([sys.executable, "-m", "rlfleet.app.cli", "sft", "--data", str(train), "--output",
                             str(out), "--max-steps", "100000", *SFT], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    stdout, stderr = StreamLines(proc.stdout), StreamLines(proc.stderr)
    try:
        stdout.wait_for("sft step    2/", timeout_s=300, alive=lambda: proc.poll() is None)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 130, stderr.rest()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    printed = stdout.rest()
    steps = sorted(int(p.name.removeprefix("step_")) for p in (out / "checkpoints").iterdir())
    assert len(steps) == 1 and steps[0] >= 2, printed  # the last finished step, saved on the way out
    last = steps[0]
    assert f"sft stopped after step {last}: checkpoint {out / 'checkpoints' / f'step_{last}'} written; " \
           "--resume latest continues it" in printed, printed
    assert "interrupted (stopped by SIGINT)" in stderr.rest() and "Traceback" not in stderr.rest()
    assert not (out / "model").exists()  # the trained model is written only by a finished run

    resumed = rlfleet("sft", "--data", str(train), "--output", str(out), "--max-steps", str(last + 1),
                      "--resume", "latest", *SFT)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"sft resumed from {out / 'checkpoints' / f'step_{last}'} (step {last}" in resumed.stdout
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == list(range(1, last + 2))


def test_sft_stopped_before_any_checkpoint_says_how_to_start_again(tmp_path: Path) -> None:
    # A second Ctrl-C stops at once: the folder may hold metric lines and no checkpoint.
    train = write_parquet(tmp_path / "train.parquet", 12, seed=0, split="train")
    out = tmp_path / "sft"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 1, "sft/loss": 3.0}\n')
    latest = rlfleet("sft", "--data", str(train), "--output", str(out), "--max-steps", "1", "--resume",
                     "latest", *SFT)
    assert latest.returncode == 2, latest.stderr[-3000:]
    assert "--resume auto" in latest.stderr and len(latest.stderr.strip().splitlines()) == 1, latest.stderr
    auto = rlfleet("sft", "--data", str(train), "--output", str(out), "--max-steps", "1", "--resume", "auto",
                   *SFT)
    assert auto.returncode == 0, auto.stderr[-3000:]
    assert "no checkpoint to resume from: sft starts fresh (1 earlier metric line dropped)" in auto.stdout
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1]


def test_commands_print_their_own_lines_not_rpc_debug_lines_or_progress_bars(tmp_path: Path) -> None:
    traces = rlfleet("data", "traces", "--env", "calculator", "--task", "arithmetic", "--rows", "8",
                     "--instruction", "", "--tools-in-prompt", "false", "--output",
                     str(tmp_path / "t.parquet"))
    assert traces.returncode == 0, traces.stderr[-3000:]
    # the environment server and client run in the process: their per-RPC debug lines were on stdout
    printed = traces.stdout.splitlines()
    assert printed == [ln for ln in printed if ln.startswith("rlfleet: ")] and traces.stderr == "", printed
    test = tmp_path / "test.parquet"
    assert rlfleet("data", "arithmetic", "--output", str(test), "--split", "test", "--rows", "2",
                   "--max-operands", "2", "--instruction", "").returncode == 0
    ev = rlfleet("eval", "--model", "builtin:tiny", "--data", str(test), "--output",
                 str(tmp_path / "ev.json"), "env.name=calculator",
                 "env.tools_in_prompt=false", "rollout.max_turns=2", "rollout.max_new_tokens=8",
                 "rollout.device=cpu")
    assert ev.returncode == 0, ev.stderr[-3000:]
    assert "rpc done" not in ev.stdout + ev.stderr and "Loading weights" not in ev.stderr, ev.stdout
    train = write_parquet(tmp_path / "train.parquet", 4, seed=0, split="train")
    sft = rlfleet("sft", "--data", str(train), "--output", str(tmp_path / "sft"), "--max-steps", "1", *SFT)
    assert sft.returncode == 0, sft.stderr[-3000:]
    assert "Loading weights" not in sft.stderr and "Writing model shards" not in sft.stderr, sft.stderr


def test_an_openenv_address_that_is_down_is_named_refused_at_once_and_while_waiting(tmp_path: Path) -> None:
    address = f"http://127.0.0.1:{port_for_later()}"  # nothing listens there
    check = rlfleet("env", "check", address, "--timeout", "5")
    assert check.returncode != 0
    assert "connection refused" in check.stdout.lower(), check.stdout

    test = tmp_path / "test.parquet"
    assert rlfleet("data", "arithmetic", "--output", str(test), "--split", "test", "--rows", "2",
                   "--instruction", "").returncode == 0
    # the gRPC path says what it waits for every few seconds; the OpenEnv one was silent for its timeout
    ev = rlfleet("eval", "--model", "builtin:tiny", "--data", str(test), "env.kind=openenv",
                 f"env.address={address}", "controller.connect_timeout_s=10")
    assert ev.returncode == 2, ev.stderr[-3000:]
    said = f"rlfleet: waiting for the OpenEnv server at {address}: "
    waiting = [ln for ln in ev.stderr.splitlines() if ln.startswith(said)]
    assert waiting and "connection refused" in waiting[0].lower(), ev.stderr
    assert "connection refused" in ev.stderr.splitlines()[-1].lower(), ev.stderr


def test_status_of_a_run_that_failed_at_the_start_says_it_failed_and_why(tmp_path: Path) -> None:
    run = rlfleet("run", f"run.output_dir={tmp_path}", "controller.max_steps=1", "rollout.device=cuda:7")
    assert run.returncode == 2 and "failed while loading" in run.stderr, run.stderr[-3000:]
    status = rlfleet("status", str(tmp_path / "default"))
    assert status.returncode == 1
    # not "stopped after step 0; controller.resume=latest continues it": a resume would fail the same way
    said = "rlfleet: run default failed before its first step: the rollout service "
    assert status.stdout.startswith(said), status.stdout
    assert "failed while loading" in status.stdout and "resume" not in status.stdout, status.stdout


def test_status_says_finished_while_the_finished_run_stops_its_services(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "rlfleet.app.cli", "run", f"run.output_dir={tmp_path}",
                             "controller.max_steps=2", "controller.prompts_per_step=2", "rollout.n=2"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout = StreamLines(proc.stdout)
    frozen = False
    try:
        # The run says it finished before it stops its services (seconds, during which every service row
        # read UNREACHABLE and status exited 1). Frozen there (SIGSTOP), it holds that moment for status.
        stdout.wait_for("rlfleet: run default finished: step 2/2; stopping the services", timeout_s=300,
                        alive=lambda: proc.poll() is None)
        proc.send_signal(signal.SIGSTOP)
        frozen = True
        status = rlfleet("status", str(tmp_path / "default"))
        assert status.returncode == 0, status.stdout
        assert status.stdout.startswith("rlfleet: run default finished: step 2/2"), status.stdout
    finally:
        if frozen:
            proc.send_signal(signal.SIGCONT)
        if proc.poll() is None:
            proc.wait(timeout=120)
    assert proc.returncode == 0, stdout.rest()


def test_an_unknown_environment_is_refused_before_the_earlier_run_is_moved_aside(tmp_path: Path) -> None:
    earlier = tmp_path / "outputs" / "default"
    earlier.mkdir(parents=True)
    (earlier / "metrics.jsonl").write_text('{"step": 1}\n')
    proc = rlfleet("run", f"run.output_dir={tmp_path / 'outputs'}", "env.name=calculater", timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        "rlfleet: error: environment 'calculater' is neither a built-in (calculator, digits_game, python) "
        "nor pkg.module:Class (did you mean 'calculator'?)"), proc.stderr
    assert [p.name for p in (tmp_path / "outputs").iterdir()] == ["default"], proc.stdout


def test_a_restarted_service_is_announced_once(tmp_path: Path) -> None:
    # The console said each death and each restart twice: rlfleet's line and the same as a log warning.
    proc = subprocess.Popen([sys.executable, "-m", "rlfleet.app.cli", "run", f"run.output_dir={tmp_path}",
                             "controller.max_steps=8", "controller.prompts_per_step=2", "rollout.n=2"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = StreamLines(proc.stdout), StreamLines(proc.stderr)
    try:
        stdout.wait_for("step    2/8", timeout_s=300, alive=lambda: proc.poll() is None)
        pid = json.loads((tmp_path / "default" / "services" / "reward.json").read_text())["pid"]
        os.kill(pid, signal.SIGKILL)  # steps 3-8 need it scored: the run restarts it to finish
        assert proc.wait(timeout=300) == 0, stderr.rest()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = stderr.rest().splitlines()
    died = [ln for ln in lines if "restarting" in ln]
    assert len(died) == 1 and f"(pid {pid}) was killed" in died[0] and "restarting it (1/3)" in died[0], lines
    restarted = [ln for ln in lines if "restarted the" in ln or "service restarted" in ln]
    assert len(restarted) == 1 and restarted[0].startswith("rlfleet: restarted the reward service"), lines
