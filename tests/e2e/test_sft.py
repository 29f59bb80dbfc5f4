"""`rlfleet sft` on the embedded tiny model: a few steps on a few rows, checkpoints, an exact resume, the
evaluation, and an output folder that `rlfleet eval` takes; LoRA merged into that folder; FSDP ranks."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlfleet.data.tasks import write_parquet
from tests.e2e.conftest import read_jsonl, rlfleet

pytestmark = pytest.mark.e2e

# The digits task's rows carry their answer as the ground truth: the response column of this SFT.
COMMON = ["--model", "builtin:tiny", "--response-key", "reward_model.ground_truth", "--batch-size", "4",
          "rollout.max_new_tokens=8", "learner.lr=1e-3"]


@pytest.fixture
def data(tmp_path: Path) -> tuple[Path, Path]:
    return (write_parquet(tmp_path / "train.parquet", 12, seed=0, split="train"),
            write_parquet(tmp_path / "val.parquet", 4, seed=0, split="test"))


def sft(*args: str, timeout: float = 300):
    return rlfleet("sft", *args, *COMMON, timeout=timeout)


def test_sft_checkpoints_resumes_exactly_and_eval_takes_its_model(tmp_path, data):
    train, val = data
    out, straight = tmp_path / "out", tmp_path / "straight"
    first = sft("--data", str(train), "--val-data", str(val), "--output", str(out), "--max-steps", "2",
                "--save-every", "1", "--eval-every", "2")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "sft on 12 examples from train.parquet: 2 steps of 4" in first.stdout
    assert "sft step    2/2 | epoch 0.67 | loss " in first.stdout
    lines = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in lines] == [0, 1, 2]  # step 0: the starting model's evaluation
    assert "val/digits_reverse/accuracy" in lines[0] and "val/digits_reverse/accuracy" in lines[2]
    assert all(m["sft/loss"] > 0 and m["sft/samples"] == 4 for m in lines[1:])
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_1", "step_2"]
    report = json.loads((out / "eval" / "step_2.json").read_text())
    assert report["by_source"]["digits_reverse"]["rule"] == "digits"

    again = sft("--data", str(train), "--output", str(out), "--max-steps", "3")
    assert again.returncode == 2 and "already holds an SFT run" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1

    resumed = sft("--data", str(train), "--val-data", str(val), "--output", str(out), "--max-steps", "3",
                  "--save-every", "1", "--eval-every", "2", "--resume", "latest")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"sft resumed from {out / 'checkpoints' / 'step_2'} (step 2" in resumed.stdout
    lines = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in lines] == [0, 1, 2, 3]

    # the same three steps without a stop: the resumed step 3 is the same step (batches, weights,
    # optimizer state and RNG restored)
    whole = sft("--data", str(train), "--output", str(straight), "--max-steps", "3")
    assert whole.returncode == 0, whole.stderr[-3000:]
    ref = read_jsonl(straight / "metrics.jsonl")
    assert [m["step"] for m in ref] == [1, 2, 3]
    for ours, theirs in zip(lines[1:], ref):
        assert ours["sft/loss"] == pytest.approx(theirs["sft/loss"], rel=1e-4), (ours, theirs)

    # the output is a model folder `rlfleet eval` (and model.path) takes
    evaluated = rlfleet("eval", "--model", str(out / "model"), "--data", str(val), "--output",
                        str(tmp_path / "eval.json"), "rollout.max_new_tokens=8", timeout=300)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    result = json.loads((tmp_path / "eval.json").read_text())
    assert result["by_source"]["digits_reverse"]["prompts"] == 4
    # and it is the trained policy: the same greedy accuracy as the run's own evaluation after step 3
    assert result["by_source"]["digits_reverse"]["accuracy"] == lines[3]["val/digits_reverse/accuracy"]


def test_sft_with_lora_writes_the_merged_model(tmp_path, data):
    from safetensors import safe_open

    train, val = data
    out = tmp_path / "lora"
    proc = sft("--data", str(train), "--output", str(out), "--max-steps", "1", "learner.lora.rank=4",
               "learner.pack_sequences=true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "checkpoints" / "step_1" / "adapter_model.safetensors").is_file()  # adapters only
    with safe_open(str(out / "model" / "model.safetensors"), "pt") as f:
        names = list(f.keys())
    assert names and not any("lora" in n or "base_layer" in n for n in names)  # a plain model, merged
    evaluated = rlfleet("eval", "--model", str(out / "model"), "--data", str(val), "--output",
                        str(tmp_path / "eval.json"), "rollout.max_new_tokens=8", timeout=300)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    # and `rlfleet run` trains from it (model.path): the built-in task, one GRPO step
    run = rlfleet("run", f"model.path={out / 'model'}", f"data.train_files=[{train}]",
                  f"run.output_dir={tmp_path / 'runs'}", "run.name=from-sft", "controller.max_steps=1",
                  "controller.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=8", timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert [m["step"] for m in read_jsonl(tmp_path / "runs" / "from-sft" / "metrics.jsonl")] == [1]


def test_sft_bad_input_is_one_clear_line(tmp_path, data):
    train, _ = data
    missing = rlfleet("sft", "--data", str(train), "--output", str(tmp_path / "v"), "--model", "builtin:tiny",
                      "--response-key", "reward_model.ground_truth",
                      f"data.val_files=[{tmp_path / 'no.parquet'}]")
    assert missing.returncode == 2 and not (tmp_path / "v" / "metrics.jsonl").exists()  # before training
    assert missing.stderr.strip() == (f"rlfleet: error: validation file {tmp_path / 'no.parquet'} "
                                      "(data.val_files) does not exist")
    proc = rlfleet("sft", "--data", str(train), "--output", str(tmp_path / "o"), "--model", "builtin:tiny",
                   "--response-key", "extra_info.solution")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"rlfleet: error: SFT data file {train}, row 0: no value for 'extra_info.solution' (--response-key); "
        "its columns are: data_source, prompt, ability, reward_model, extra_info")


@pytest.mark.slow
def test_sft_on_two_fsdp_ranks(tmp_path, data):
    train, val = data
    out = tmp_path / "fsdp"
    proc = sft("--data", str(train), "--val-data", str(val), "--output", str(out), "--max-steps", "2",
               "learner.world_size=2", "learner.device=cpu", "learner.micro_batch_tokens=32", timeout=400)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in lines] == [1, 2]  # written once, by rank 0
    assert "val/digits_reverse/accuracy" in lines[-1]  # evaluated on the gathered weights
    meta = json.loads((out / "checkpoints" / "step_2" / "meta.json").read_text())
    assert meta["learner_world_size"] == 2
    assert (out / "model" / "model.safetensors").is_file()
