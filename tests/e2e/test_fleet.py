"""The elastic rollout fleet with real processes: replicas join a running job, one is killed -9, one is
drained, and the run trains on until it is stopped with nothing lost, nothing trained twice and the
staleness bound held; joiners with the wrong token or another model are refused in one line."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from controller.journal import audit
from tests.e2e.conftest import REPO, read_jsonl
from tests.e2e.fleet_procs import JOB, STALENESS, events, free_port, start, stop, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# The run has no step limit: it is stopped (Ctrl-C) once the joins, the kill and the drain are over
# and what was handed back is trained. A fixed max_steps raced the machine's pace: 60 steps took the
# choreography's ~25 on two busy cores, but 6 s on an idle machine, before replica b had joined.
MORE_STEPS = 2  # step lines after the drain, each with the one replica left


def test_replicas_join_one_is_killed_one_drained_and_nothing_is_lost(run_dir, tmp_path):
    port = free_port()
    controller = f"127.0.0.1:{port}"
    run = run_dir / "fleet"
    job = (f"run.output_dir={run_dir}", *JOB)
    main = start("run", *job, "run.name=fleet", f"controller.port={port}", "controller.max_steps=100000",
                 "tracking.tensorboard=true", log=tmp_path / "run")
    # The joiners load their model while the run starts and join once its controller answers.
    joiners = {name: start("serve", "rollout", "--join", controller, *job, f"run.name={name}",
                           log=tmp_path / name) for name in ("a", "b")}
    procs = [main, *joiners.values()]
    try:
        def joined(name: str):
            info = run_dir / name / "services"
            files = list(info.glob("rollout-*.json")) if info.is_dir() else []
            if not files:
                return None
            address = json.loads(files[0].read_text())["address"]
            entries = events(run)
            return address if any(e["event"] == "generated" and e.get("replica") == address
                                  for e in entries) else None
        address = {name: wait_for(f"replica {name} generated a group", lambda n=name: joined(n), procs)
                  for name in joiners}
        entries = events(run)
        for name, addr in address.items():  # join to first work
            accepted = next(e["t"] for e in entries if e["event"] == "join_accepted" and e["replica"] == addr)
            first = next(e["t"] for e in entries if e["event"] == "dispatched" and e["replica"] == addr)
            assert first - accepted < 10, (name, first - accepted)
        wait_for("a step line with 3 replicas",
                 lambda: any(m.get("fleet/replicas") == 3 for m in read_jsonl(run / "metrics.jsonl")), procs)
        # Prometheus: the controller's /metrics carries the step line's fleet/* keys
        metrics_port = json.loads((run / "services" / "controller.json").read_text())["metrics_port"]
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        scraped = urllib.request.urlopen(url, timeout=10).read().decode()
        assert 'rlfleet_train_metric{metric="fleet/replicas"}' in scraped
        assert 'rlfleet_train_metric{metric="fleet/joins"}' in scraped
        status = subprocess.run([sys.executable, "-m", "rlfleet.app.cli", "status", str(run), "--json"],
                                cwd=REPO, capture_output=True, text=True, timeout=60)
        rows = {r["address"]: r for r in json.loads(status.stdout)}
        assert all(rows[a]["fleet"].startswith("live (joined)") for a in address.values()), rows

        # kill -9 replica a while it generates: noticed within seconds, its groups re-queued
        def generating(addr: str) -> bool:
            mine = [e for e in events(run) if e.get("replica") == addr and e["event"] in ("dispatched",
                                                                                           "generated")]
            return bool(mine) and mine[-1]["event"] == "dispatched"
        deadline = time.monotonic() + 60
        while not generating(address["a"]):
            assert time.monotonic() < deadline, "replica a never seen generating"
            time.sleep(0.002)
        killed_at = time.time()
        os.kill(joiners["a"].pid, signal.SIGKILL)
        joiners["a"].wait()
        left = wait_for("replica a left", lambda: next(
            (e for e in events(run) if e["event"] == "left" and e["replica"] == address["a"]), None),
            [main], timeout_s=30)
        # noticed by its broken stream, not by waiting out controller.service_wait_s (60 s); a third of
        # that leaves a loaded machine room
        assert left["t"] - killed_at < 20, left
        # a step line shows the fleet without a before the drain (else kill and drain can land between
        # two step lines and the line with 2 replicas never exists)
        wait_for("a step line with 2 replicas after the kill", lambda: any(
            m.get("fleet/leaves") == 1 and m.get("fleet/replicas") == 2
            for m in read_jsonl(run / "metrics.jsonl")), [main])
        # drain replica b: it finishes or hands back its groups, leaves, and its process stops
        drain = subprocess.run([sys.executable, "-m", "rlfleet.app.cli", "fleet", "drain", address["b"],
                                "--controller", controller, "--timeout", "20"], cwd=REPO,
                               capture_output=True, text=True, timeout=120)
        assert drain.returncode == 0, drain.stderr
        assert re.search(r"left the run: \d+ groups finished, \d+ handed back", drain.stdout), drain.stdout
        assert joiners["b"].wait(timeout=30) == 0

        def handed_back_trained() -> bool:
            entries = events(run)
            back = {e["seq"] for e in entries if e["event"] == "requeued" and e["reason"] == "replica_left"}
            return back <= {e["seq"] for e in entries if e["event"] == "trained"}
        wait_for("what the replicas handed back trained", handed_back_trained, [main])
        after_drain = wait_for("a step line after the drain", lambda: next(
            (m["step"] for m in read_jsonl(run / "metrics.jsonl") if m["fleet/leaves"] == 2), None), [main])
        wait_for(f"{MORE_STEPS} more steps", lambda: len(read_jsonl(run / "metrics.jsonl"))
                 >= after_drain + MORE_STEPS, [main])
        main.send_signal(signal.SIGINT)
        assert main.wait(timeout=120) == 130, (tmp_path / "run.err").read_text()[-3000:]  # Ctrl-C's code
    finally:
        stop(*procs)

    metrics = read_jsonl(run / "metrics.jsonl")
    steps = len(metrics)
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))
    fleet = [m["fleet/replicas"] for m in metrics]
    # 1 -> 3 (two joins, the first may come before step 1 ends) -> 2 (kill -9) -> 1 (drain)
    assert 3 in fleet and 2 in fleet[fleet.index(3):] and fleet[-1] == 1, fleet
    assert fleet == sorted(fleet[:fleet.index(3) + 1]) + sorted(fleet[fleet.index(3) + 1:], reverse=True)
    assert metrics[-1]["fleet/joins"] == 2 and metrics[-1]["fleet/leaves"] == 2
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = EventAccumulator(str(run / "tensorboard"))
    tb.Reload()
    assert {"fleet/replicas", "fleet/joins", "fleet/leaves"} <= set(tb.Tags()["scalars"])
    assert max(e.value for e in tb.Scalars("fleet/replicas")) == 3
    result = audit(run / "journal" / "prompts.jsonl")
    assert result.lost == [] and result.trained_twice == []
    trained_per_step = Counter(e["step"] for e in read_jsonl(run / "journal" / "prompts.jsonl")
                               if e["event"] == "trained")
    # every step with a line trained 4 prompts; the stop may come between a step's Train and its line
    assert all(trained_per_step[s] == 4 for s in range(1, steps + 1)), trained_per_step
    assert set(trained_per_step) <= set(range(1, steps + 2)), trained_per_step
    entries = read_jsonl(run / "journal" / "prompts.jsonl")
    # what a leaving replica handed back went to another and was trained there, once
    for e in (e for e in entries if e["event"] == "requeued" and e["reason"] == "replica_left"):
        later = entries[entries.index(e):]
        assert any(x["event"] == "dispatched" and x["seq"] == e["seq"] and x["replica"] != e["replica"]
                   for x in later), e
        assert result.trained[e["seq"]] == 1, e
    # what the killed replica had in flight was requeued from it (it may have had nothing in flight: it
    # can be waiting for admission, its groups done, when the kill lands; nothing lost is checked above)
    sent_to_a = {e["seq"] for e in entries if e["event"] == "dispatched" and e["replica"] == address["a"]}
    made_by_a = {e["seq"] for e in entries if e["event"] == "generated" and e.get("replica") == address["a"]}
    requeued_from_a = {e["seq"] for e in entries
                       if e["event"] == "requeued" and e.get("replica") == address["a"]}
    assert sent_to_a - made_by_a <= requeued_from_a, (sent_to_a - made_by_a, requeued_from_a)
    reasons = {e["replica"]: e["reason"] for e in entries if e["event"] == "left"}
    assert reasons[address["b"]] == "drained" and reasons[address["a"]] in ("failed", "unreachable"), reasons
    # the staleness bound held for every trained sample, whichever replica made it
    samples = read_jsonl(run / "samples" / "train.jsonl")
    assert {s["replica"] for s in samples} >= set(address.values())
    assert all(0 <= s["trained_version"] - s["version"] <= STALENESS for s in samples)


def _other_model(tmp_path: Path) -> Path:
    """The built-in model with another architecture setting: a different model for the fleet."""
    from rlfleet.models.resolve import resolve_model_path

    folder = tmp_path / "other-model"
    shutil.copytree(resolve_model_path("builtin:tiny"), folder)
    config = json.loads((folder / "config.json").read_text())
    config["rms_norm_eps"] = 1e-5
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_refusals_in_one_line_a_frozen_member_rejoins_and_sigterm_leaves_cleanly(run_dir, tmp_path):
    port = free_port()
    controller = f"127.0.0.1:{port}"
    job = (f"run.output_dir={run_dir}", *JOB)
    token = "security.token=the-jobs-token-0123456789"
    main = start("run", *job, "run.name=guarded", f"controller.port={port}", "controller.max_steps=100000",
                 token, log=tmp_path / "run")
    wrong_token = start("serve", "rollout", "--join", controller, *job, "run.name=intruder",
                        "security.token=not-the-jobs-token-9876543210", log=tmp_path / "intruder")
    other_model = start("serve", "rollout", "--join", controller, *job, "run.name=stranger", token,
                        f"model.path={_other_model(tmp_path)}", log=tmp_path / "stranger")
    welcome = start("serve", "rollout", "--join", controller, *job, "run.name=welcome", token,
                    log=tmp_path / "welcome")
    run = run_dir / "guarded"
    try:
        assert wrong_token.wait(timeout=240) == 78  # refused: a restart would be refused again
        assert other_model.wait(timeout=240) == 78
        # the one with the token and the model works, then SIGTERM: it hands its work over and leaves
        def joiner_generated() -> bool:
            entries = events(run)
            joined = {e["replica"] for e in entries if e["event"] == "joined"}
            return any(e["event"] == "generated" and e["replica"] in joined for e in entries)
        wait_for("the welcome replica generated", joiner_generated, [main, welcome])
        # Frozen (SIGSTOP): it stops answering, is dropped, and the run goes on; thawed, it finds
        # itself dropped and joins again, holding weights many versions old: it gets the current
        # ones before any work, so the staleness bound holds.
        address = next(e["replica"] for e in events(run) if e["event"] == "joined")
        os.kill(welcome.pid, signal.SIGSTOP)
        try:
            wait_for("the frozen replica dropped", lambda: any(
                e["event"] == "left" and e["replica"] == address for e in events(run)), [main], timeout_s=60)
            versions_on = len(read_jsonl(run / "metrics.jsonl"))
            wait_for("two more steps without it", lambda: len(read_jsonl(run / "metrics.jsonl"))
                     >= versions_on + 2, [main], timeout_s=60)
        finally:
            os.kill(welcome.pid, signal.SIGCONT)

        def rejoined_and_generated() -> bool:
            entries = events(run)
            rejoined = [i for i, e in enumerate(entries)
                        if e["event"] == "joined" and e["replica"] == address]
            return len(rejoined) >= 2 and any(e["event"] == "generated" and e["replica"] == address
                                              for e in entries[rejoined[1]:])
        wait_for("the thawed replica rejoined and generated", rejoined_and_generated, [main, welcome],
                 timeout_s=120)
        welcome.send_signal(signal.SIGTERM)
        assert welcome.wait(timeout=120) == 0
        assert main.poll() is None  # the run goes on without it
        main.send_signal(signal.SIGINT)  # a clean stop: what is in flight is re-queued in the journal
        main.wait(timeout=120)
    finally:
        stop(main, wrong_token, other_model, welcome)
    assert "left the run (sigterm)" in (tmp_path / "welcome.out").read_text()
    left = [e for e in events(run) if e["event"] == "left"]
    assert left[0]["reason"] == "unreachable" and left[-1]["reason"] == "sigterm", left
    result = audit(run / "journal" / "prompts.jsonl")
    assert result.lost == [] and result.trained_twice == []
    samples = read_jsonl(run / "samples" / "train.jsonl")
    assert all(0 <= s["trained_version"] - s["version"] <= STALENESS for s in samples)
    # the replica's one line, and the controller's
    for name, reason in (("intruder", "invalid bearer token"),
                         ("stranger", "different model than this run: rms_norm_eps 1e-05 (this run: 1e-06)")):
        lines = (tmp_path / f"{name}.err").read_text().splitlines()
        errors = [ln for ln in lines if ln.startswith("rlfleet:")]
        assert len(errors) == 1 and reason in errors[0], errors
        assert errors[0].startswith(f"rlfleet: error: the controller at {controller} refused rollout replica")
    controller_lines = [ln for ln in (tmp_path / "run.err").read_text().splitlines() if "refused" in ln]
    assert len(controller_lines) == 2, controller_lines
    assert any("invalid bearer token" in ln for ln in controller_lines)
    assert any("rms_norm_eps 1e-05 (this run: 1e-06)" in ln for ln in controller_lines)
