"""GSM8K-format JSONL -> Parquet -> a real `rlfleet run`, watched the way a user would watch it:
/metrics of every service scraped twice during the run, `rlfleet status` on the live run, then
metrics.jsonl, TensorBoard, W&B (offline), the JSON logs, `rlfleet plot` and `rlfleet eval` on the
final checkpoint."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rlfleet.app.cli import main as cli_main
from tests.e2e.conftest import REPO, read_jsonl, rlfleet

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ARCH_METRICS = {
    "reward/mean",
    "reward/std",
    "actor/pg_loss",
    "actor/kl_loss",
    "actor/entropy",
    "actor/pg_clipfrac",
    "actor/grad_norm",
    "actor/lr",
    "response_length/mean",
    "staleness/mean",
    "staleness/max",
    "timing/gen_s",
    "timing/reward_s",
    "timing/train_s",
    "timing/weight_sync_s",
    "perf/tokens_per_s",
    "perf/samples_per_s",
    "rollout/logprob_diff_mean",
}
ROLES = ("controller", "rollout", "reward", "learner")
SHORT_QUESTIONS = [
    ("Tom has 3 apples and buys 4 more. How many apples?", "3+4=7\n#### 7"),
    ("A box holds 12 pens. How many pens in 2 boxes?", "2*12=24\n#### 24"),
    ("Sam reads 5 pages a day. How many in 6 days?", "5*6=30\n#### 30"),
    ("Ann had 20 cards and gave away 8. How many left?", "20-8=12\n#### 12"),
    ("A bus has 40 seats and 15 are empty. How many full?", "40-15=25\n#### 25"),
    ("Joe earns $1,200 a week. How much in 2 weeks?", "2*1200=2400\n#### 2,400"),
]
# longer than data.max_prompt_length=160 tokens once templated: filtered and counted, never truncated
LONG_QUESTIONS = [("A farmer " + "walks to the field and back again, " * 5 + "how far?", "#### 9")] * 2


def scrape(port: int) -> dict[tuple, float]:
    """{(sample name, sorted labels): value} plus {("TYPE", family name): 1} for every declared family."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[tuple, float] = {}
    for family in text_string_to_metric_families(text):
        out[("TYPE", family.name)] = 1.0
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(snapshot: dict, name: str, **labels: str) -> float:
    return snapshot.get((name, tuple(sorted(labels.items()))), 0.0)


def wait_for(check, proc: subprocess.Popen, stderr: Path, timeout: float = 240.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        if proc.poll() is not None:
            pytest.fail(f"rlfleet run exited ({proc.returncode}) early: {stderr.read_text()[-3000:]}")
        time.sleep(0.2)
    pytest.fail(f"timed out; stderr: {stderr.read_text()[-3000:]}")


# what must grow between the two scrapes, in each service
GREW = [
    ("rollout", "rlfleet_tokens_total", {"service": "rollout"}),
    ("rollout", "rlfleet_rpc_latency_seconds_count", {"service": "rollout", "method": "PullWeights"}),
    ("rollout", "rlfleet_weight_sync_seconds_count", {"service": "rollout"}),
    ("rollout", "rlfleet_policy_version", {"service": "rollout"}),
    ("reward", "rlfleet_rpc_latency_seconds_count", {"service": "reward", "method": "Score"}),
    ("learner", "rlfleet_rpc_latency_seconds_count", {"service": "learner", "method": "Train"}),
    ("learner", "rlfleet_tokens_total", {"service": "learner"}),
    ("learner", "rlfleet_weight_sync_seconds_count", {"service": "learner"}),
    ("learner", "rlfleet_policy_version", {"service": "learner"}),
    ("controller", "rlfleet_train_step", {}),
    ("controller", "rlfleet_policy_version", {"service": "controller"}),
]


def grown(announced: dict, first: dict) -> dict | None:
    """Every service scraped again, once each metric of GREW has grown past `first` (None before: the
    controller sets its gauges after writing its metrics line, so a scrape right after a step's line may
    still show the step before; a service already gone: None, and wait_for reports the run's end)."""
    try:
        snap = {r: scrape(a["metrics_port"]) for r, a in announced.items()}
    except OSError:
        return None
    return snap if all(value(snap[role], name, **labels) > value(first[role], name, **labels)
                       for role, name, labels in GREW) else None


def steps_done(path: Path) -> int:
    if not path.exists():
        return 0
    return max((json.loads(x)["step"] for x in path.read_text().splitlines() if x.strip()), default=0)


def test_gsm8k_jsonl_trains_and_every_service_is_observable(tmp_path, capsys):
    # ---- data: a GSM8K-format JSONL made here, converted by the CLI
    # ------------------------------------------
    src = tmp_path / "gsm8k_train.jsonl"
    src.write_text(
        "".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in SHORT_QUESTIONS + LONG_QUESTIONS)
    )
    train = tmp_path / "train.parquet"
    conv = rlfleet("data", "gsm8k", "--input", str(src), "--output", str(train), timeout=120)
    assert conv.returncode == 0, conv.stderr
    val = tmp_path / "val.parquet"
    assert rlfleet("data", "digits-reverse", "--output", str(val), "--size", "16").returncode == 0

    runs = tmp_path / "runs"
    out = runs / "obs"
    stdout, stderr = tmp_path / "run.out", tmp_path / "run.err"
    cmd = [
        sys.executable,
        "-m",
        "rlfleet.app.cli",
        "run",
        f"run.output_dir={runs}",
        "run.name=obs",
        "run.log_level=debug",
        f"data.train_files=[{train}]",
        f"data.val_files=[{val},{train}]",
        "data.max_prompt_length=160",
        "controller.max_steps=6",
        "controller.eval_every=3",
        "controller.prompts_per_step=4",
        "rollout.n=4",
        "tracking.wandb=true",
        "tracking.wandb_mode=offline",
    ]
    with open(stdout, "w") as so, open(stderr, "w") as se:
        proc = subprocess.Popen(
            cmd, cwd=REPO, stdout=so, stderr=se, env={**os.environ, "WANDB_SILENT": "true"}
        )
    try:
        # ---- during the run: scrape every /metrics twice, and `rlfleet status`
        # --------------------------------
        wait_for(lambda: steps_done(out / "metrics.jsonl") >= 1, proc, stderr)
        announced = {r: json.loads((out / "services" / f"{r}.json").read_text()) for r in ROLES}
        first = {r: scrape(a["metrics_port"]) for r, a in announced.items()}
        wait_for(lambda: steps_done(out / "metrics.jsonl") >= 3, proc, stderr)
        second = wait_for(lambda: grown(announced, first), proc, stderr)
        sd_file = tmp_path / "targets.json"
        code = cli_main(["status", str(out), "--prometheus-sd", str(sd_file)])
        status_out = capsys.readouterr().out
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr.read_text()[-3000:]

    # metrics move in each service
    for role in ROLES:
        for name in ("rlfleet_queue_depth", "rlfleet_rpc_in_flight", "rlfleet_policy_version"):
            assert ("TYPE", name) in second[role], (role, name)
    for role, name, labels in GREW:
        assert value(second[role], name, **labels) > value(first[role], name, **labels), (role, name, labels)
    assert ("rlfleet_train_metric", (("metric", "reward/mean"),)) in second["controller"]

    # the Grafana dashboard only uses metrics that the services export
    dashboard = (REPO / "deploy" / "grafana" / "rlfleet-dashboard.json").read_text()
    exported = {key[1] for snap in second.values() for key in snap if key[0] == "TYPE"}
    for name in set(re.findall(r"rlfleet_[a-z_]+", dashboard)):
        base = re.sub(r"_(bucket|count|sum|total)$", "", name)
        assert name in exported or base in exported, name

    # `rlfleet status` on the live run: every service, serving, with versions and load
    assert code == 0, status_out
    table = [line for line in status_out.splitlines() if not line.startswith("rlfleet:")]
    assert table[0].split()[:6] == ["role", "address", "pid", "restarts", "metrics_port", "health"]
    rows = {line.split()[0]: line for line in table[1:]}
    assert set(rows) == set(ROLES), status_out
    for role in ROLES:
        assert announced[role]["address"] in rows[role] and "SERVING" in rows[role], rows[role]
    assert (
        "groups buffered" in rows["controller"] and "tokens" in rows["rollout"] and "scored" in rows["reward"]
    )
    targets = json.loads(sd_file.read_text())
    assert sorted(t["targets"][0] for t in targets) == sorted(
        f"127.0.0.1:{a['metrics_port']}" for a in announced.values()
    )

    # ---- after the run
    # --------------------------------------------------------------------------------------
    lines = read_jsonl(out / "metrics.jsonl")
    train_lines = [m for m in lines if m["step"] > 0]
    assert [m["step"] for m in train_lines] == [1, 2, 3, 4, 5, 6]
    for m in train_lines:
        assert ARCH_METRICS <= m.keys(), ARCH_METRICS - m.keys()
    val_steps = [m["step"] for m in lines if "val/digits_reverse/accuracy" in m]
    assert val_steps == [0, 3, 6]
    # the console: a line per step with its time and an ETA, flagged where no group had signal
    printed = stdout.read_text().splitlines()
    step_lines = [line for line in printed if line.startswith("step ")]
    assert len(step_lines) == 6 and all(" s/step" in line for line in step_lines), printed
    assert all("| ETA " in line for line in step_lines[:-1]) and "ETA" not in step_lines[-1]
    for line, m in zip(step_lines, train_lines):
        assert ("| no signal: " in line) == (m["groups/no_signal"] == m["groups/trained"]), (line, m)
    flat = sum("| no signal: " in line for line in step_lines)  # the tiny model rarely answers GSM8K
    assert (f"rlfleet: {flat} of 6 steps had no signal" in "\n".join(printed)) == (flat > 0)
    if all("| no signal: " in line for line in step_lines[:5]):
        assert any(line.startswith("rlfleet: not learning: no signal for 5 steps in a row (steps 1-5)")
                   for line in printed)
    # each validation (steps 0, 3, 6) prints rlfleet eval's table: a row per source and one for all
    starts = [i for i, line in enumerate(printed) if line.startswith("rlfleet: validation of policy version")]
    assert [printed[i].split(" at step ")[1].split()[0] for i in starts] == ["0", "3", "6"], printed
    for i in starts:
        assert printed[i + 1].split()[:5] == ["data_source", "prompts", "samples", "accuracy", "baseline"]
        assert [printed[i + k].split()[0] for k in (2, 3, 4)] == ["digits_reverse", "openai/gsm8k", "all"]
    for m in lines:
        if m["step"] in val_steps:
            assert (
                0.0 <= m["val/openai/gsm8k/accuracy"] <= 1.0
                and 0.0 <= m["val/digits_reverse/accuracy"] <= 1.0
            )
    # the two long prompts were filtered (train and val each loaded the file) and the count reported
    controller_log = read_jsonl(out / "logs" / "controller.log")
    filtered = [ln["count"] for ln in controller_log if ln["event"] == "prompts filtered for length"]
    assert filtered == [2, 2], filtered
    assert "prompts filtered for length" in stderr.read_text()
    # rewards came from the GSM8K function: data_source openai/gsm8k, binary scores, '#### N' truths
    samples = read_jsonl(out / "samples" / "train.jsonl")
    assert {s["ground_truth"] for s in samples} <= {"7", "24", "30", "12", "25", "2400"}
    assert {s["reward"] for s in samples} <= {0.0, 1.0}
    # JSON logs carry run, step, policy version and request id
    (step2,) = [ln for ln in controller_log if ln["event"] == "step done" and ln["step"] == 2]
    assert (step2["run"], step2["policy_version"], step2["service"]) == ("obs", 1, "controller")
    train_rpcs = [
        ln
        for ln in read_jsonl(out / "logs" / "learner.log")
        if ln["event"] == "rpc done" and ln.get("rpc") == "Train"
    ]
    assert [ln["step"] for ln in train_rpcs] == [1, 2, 3, 4, 5, 6]
    assert all(ln["request_id"] and ln["run"] == "obs" and "policy_version" in ln for ln in train_rpcs)
    # TensorBoard has every metric of the architecture page, and the validation ones
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = EventAccumulator(str(out / "tensorboard"))
    tb.Reload()
    assert ARCH_METRICS | {"val/digits_reverse/accuracy", "policy_version"} <= set(tb.Tags()["scalars"])
    # ... and a few validation samples per evaluation (steps 0, 3, 6) in its text tab
    assert {"val/digits_reverse/samples", "val/openai/gsm8k/samples"} <= set(tb.Tags()["tensors"])
    assert [e.step for e in tb.Tensors("val/digits_reverse/samples")] == [0, 3, 6]
    # `rlfleet samples`: the last step's samples, readable, and the validation ones as JSON
    shown = rlfleet("samples", str(out), "--last", "2", timeout=60)
    assert shown.returncode == 0, shown.stderr
    headers = [line for line in shown.stdout.splitlines() if line.startswith("── ")]
    assert len(headers) == 2
    assert all(h.startswith("── step 6 · prompt ") and "staleness" in h for h in headers), headers
    val_json = rlfleet("samples", str(out), "--val", "--step", "6", "--last", "0", "--json", timeout=60)
    assert val_json.returncode == 0, val_json.stderr
    val_records = [json.loads(x) for x in val_json.stdout.splitlines()]
    # 16 digits-reverse prompts and the 6 short GSM8K ones (the 2 long ones filtered)
    assert len(val_records) == 16 + 6 and {r["step"] for r in val_records} == {6}
    # W&B (offline) received the metrics
    (wandb_file,) = (out / "wandb").glob("offline-run-*/run-*.wandb")
    blob = wandb_file.read_bytes()
    assert b"reward/mean" in blob and b"val/digits_reverse/accuracy" in blob

    # ---- `rlfleet plot` writes a PNG that opens -----------------------------------------------------------
    plot = rlfleet("plot", str(out), timeout=120)
    assert plot.returncode == 0, plot.stderr
    from PIL import Image

    with Image.open(out / "curves.png") as img:
        assert img.format == "PNG" and img.size == (1200, 880)
        colors = img.convert("RGB").getcolors(maxcolors=1 << 16)
        assert colors is None or len(colors) > 20  # curves, not a blank canvas

    # ---- `rlfleet eval` on the final checkpoint agrees with the last validation
    # -------------------------------
    report = tmp_path / "eval.json"
    ev = rlfleet("eval", "--model", str(out), "--data", str(val), "--output", str(report), timeout=180)
    assert ev.returncode == 0, ev.stderr
    result = json.loads(report.read_text())
    assert result["model"].endswith("checkpoints/step_6")
    last_val = lines[-1]["val/digits_reverse/accuracy"]
    assert abs(result["by_source"]["digits_reverse"]["accuracy"] - last_val) <= 1 / 16 + 1e-9
