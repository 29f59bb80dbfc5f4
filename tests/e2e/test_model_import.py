"""`rlfleet model import` of a real GGUF (SmolLM2-135M-Instruct), its one-line errors, the GSM8K
recipe (deploy/configs/gsm8k-smollm2-135m.yaml) run for 2 steps on CPU with that model, and the arithmetic
recipe's SFT data under that model's chat template, with `rlfleet sft` run on its config."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.conftest import REPO, ImportedModel, read_jsonl, rlfleet

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
ASSETS = REPO / "tests" / "assets" / "gsm8k"  # a few GSM8K rows (MIT, see LICENSE there)
# `smollm2` (tests/e2e/conftest.py): the GGUF imported once per session through the real command.


def test_import_writes_a_clean_hf_folder(smollm2_import: ImportedModel) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    smollm2, printed = smollm2_import.path, smollm2_import.stdout
    assert "LlamaForCausalLM" in printed and "30 layers" in printed and "context 8192" in printed, printed
    names = {p.name for p in smollm2.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json"} <= names
    config = json.loads((smollm2 / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "bfloat16"
    assert json.loads((smollm2 / "generation_config.json").read_text())["eos_token_id"] == 2  # <|im_end|>
    tok = AutoTokenizer.from_pretrained(smollm2)
    assert tok.eos_token == "<|im_end|>"  # the GGUF's own eos (transformers 5.17 had taken <|im_start|>)
    question = "What is the capital of France?"
    text = tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                   add_generation_prompt=True)
    assert text.endswith(f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n")
    model = AutoModelForCausalLM.from_pretrained(smollm2)
    ids = tok(text, return_tensors="pt", add_special_tokens=False)
    out = model.generate(**ids, max_new_tokens=16, do_sample=False)
    answer = tok.decode(out[0, ids["input_ids"].shape[1]:])
    # the real model, not random weights: it answers, and ends its turn with the eos the rollout stops at
    assert answer == "The capital of France is Paris.<|im_end|>", answer


def test_import_errors_are_one_line(tmp_path: Path) -> None:
    import gguf

    not_gguf = tmp_path / "weights.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 not a model")
    empty = tmp_path / "empty"
    empty.mkdir()
    odd = tmp_path / "odd.gguf"  # a real GGUF of an architecture transformers cannot read
    writer = gguf.GGUFWriter(str(odd), "nosucharch")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("x")
    cases = [(not_gguf, "neither a GGUF file"), (empty, "a folder without config.json"),
             (tmp_path / "missing.gguf", "no such file or folder"),
             (odd, "GGUF architecture 'nosucharch' cannot be read by this transformers (it reads ")]
    for src, message in cases:
        proc = rlfleet("model", "import", str(src), "--output", str(tmp_path / "out"))
        assert proc.returncode == 2 and message in proc.stderr, (src, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    proc = rlfleet("model", "import", str(empty), "--output", str(busy))
    assert proc.returncode == 2 and "exists and is not empty (pass --force" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_gsm8k_recipe_smoke_on_cpu(smollm2: Path, tmp_path: Path) -> None:
    """The recipe's steps, shrunk: prepare data, train 1 step (SmolLM2 on the CPU: ~12 s of training and
    ~7 s of weight sync a step) evaluating the base model at step 0 and the trained one at step 1,
    evaluate the checkpoint with `rlfleet eval`, plot."""
    data = tmp_path / "data"
    for split in ("train", "test"):
        proc = rlfleet("data", "gsm8k", "--input", str(ASSETS / f"{split}.jsonl"), "--output",
                       str(data / f"{split}.parquet"), "--split", split)
        assert proc.returncode == 0, proc.stderr
    shrink = [f"model.path={smollm2}", f"data.train_files=[{data / 'train.parquet'}]",
              f"data.val_files=[{data / 'test.parquet'}]", f"run.output_dir={tmp_path / 'runs'}",
              "rollout.n=2", "rollout.max_new_tokens=12", "controller.prompts_per_step=2",
              "controller.max_steps=1",
              "controller.eval_every=1", "learner.checkpoint_every=1", "learner.lr=2e-5",
              "learner.lr_warmup_steps=1",
              "rollout.device=cpu", "learner.device=cpu", "reward.device=cpu"]
    config = str(REPO / "deploy" / "configs" / "gsm8k-smollm2-135m.yaml")
    # The base model's evaluation is the run's step-0 evaluation (controller.eval_before_train), the same
    # code as `rlfleet eval`, which evaluates the checkpoint afterwards.
    run = rlfleet("run", "--config", config, *shrink, timeout=900)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert "6 training prompts from train.parquet" in run.stdout
    run_dir = tmp_path / "runs" / "gsm8k-smollm2-135m"
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    train = [m for m in metrics if "actor/pg_loss" in m]
    assert [m["step"] for m in train] == [1]
    assert train[0]["actor/lr"] == pytest.approx(1e-5)  # the recipe's warmup: half the peak at step 1 of 1
    assert [m["step"] for m in metrics if "val/openai/gsm8k/accuracy" in m] == [0, 1]
    samples = read_jsonl(run_dir / "samples" / "train.jsonl")
    assert {s["prompt_index"] for s in samples} <= set(range(6))
    after = rlfleet("eval", "--config", config, *shrink, "--model", str(run_dir), "--output",
                    str(tmp_path / "after.json"))
    assert after.returncode == 0, after.stderr[-3000:]
    assert json.loads((tmp_path / "after.json").read_text())["model"].endswith("step_1")
    assert rlfleet("plot", str(run_dir)).returncode == 0


def test_arithmetic_sft_with_smollm2s_chat_template(smollm2: Path, tmp_path: Path) -> None:
    """A real chat template (ChatML): the SFT responses are the worked answers ending at <|im_end|>; two
    SFT steps with the recipe's SFT config, and `rlfleet eval` takes the folder it writes. The commands run
    on the embedded tiny model (its template is ChatML too): `rlfleet sft` and `rlfleet eval` on SmolLM2
    itself are tests/e2e/test_onegpu_calculator_phase.py's (2 SFT steps, six evaluations)."""
    from transformers import AutoTokenizer

    from rlfleet.data.sft import load_examples

    data = tmp_path / "data"
    for rows, split in (("8", "train"), ("4", "test")):
        proc = rlfleet("data", "arithmetic", "--output", str(data / f"{split}.parquet"), "--rows", rows,
                       "--split", split)
        assert proc.returncode == 0, proc.stderr
    tok = AutoTokenizer.from_pretrained(smollm2)
    examples, _ = load_examples([data / "train.parquet"], tok, "prompt", "extra_info.answer", 1024, [2])
    for e in examples:
        assert e.response_ids[-1] == 2 and 2 not in e.response_ids[:-1]  # <|im_end|>, once, at the end
        assert tok.decode(e.prompt_ids).endswith("<|im_start|>assistant\n")
        assert "####" in tok.decode(e.response_ids[:-1])
    config = str(REPO / "deploy" / "configs" / "arithmetic-smollm2-135m.yaml")
    settings = ["rollout.max_new_tokens=16", "rollout.device=cpu", "learner.device=cpu", "reward.device=cpu"]
    out = tmp_path / "sft"
    proc = rlfleet("sft", "--config", config, "--model", "builtin:tiny", "--data",
                   str(data / "train.parquet"), "--output", str(out), "--max-steps", "2", "--batch-size", "4",
                   "--val-data",
                   str(data / "test.parquet"), *settings, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in lines] == [1, 2] and all(m["sft/loss"] > 0 for m in lines)
    assert "val/rlfleet/arithmetic/accuracy" in lines[-1]  # evaluated after the last step
    assert lines[0]["actor/lr"] == pytest.approx(2e-5 / 11)  # the config: lr 2e-5, 10 warmup steps
    evaluated = rlfleet("eval", "--config", config, "--model", str(out / "model"), "--data",
                        str(data / "test.parquet"), "--output", str(tmp_path / "eval.json"), *settings,
                        timeout=900)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    result = json.loads((tmp_path / "eval.json").read_text())
    assert result["by_source"]["rlfleet/arithmetic"]["prompts"] == 4


def test_import_of_an_hf_folder(tiny_model_dir: Path, tmp_path: Path) -> None:
    """An HF folder (here the tests' tiny Qwen2) is rewritten as a clean folder with the same weights."""
    import torch
    from safetensors.torch import load_file

    out = tmp_path / "copy"
    proc = rlfleet("model", "import", str(tiny_model_dir), "--output", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "imported hf" in proc.stdout and "largest logit difference 0.00e+00" in proc.stdout
    before, after = load_file(next(tiny_model_dir.glob("*.safetensors"))), load_file(out /
    "model.safetensors")
    assert set(after) <= set(before) and all(torch.equal(before[k], after[k]) for k in after)
