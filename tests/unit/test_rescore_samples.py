"""bench/rescore_samples.py: stored GSM8K responses re-scored under verl's strict and flexible rules and
the lenient one, from `rlfleet eval` samples and from a run's val.jsonl (one row per step)."""
import json

import pytest

from bench.rescore_samples import main

pytestmark = pytest.mark.unit


def sample(response, truth="18", finish="stop", **extra):
    return {"prompt_index": 0, "data_source": "openai/gsm8k", "sample": 0, "prompt": "q",
            "response": response, "ground_truth": truth, "length": 10, "finish_reason": finish,
            "policy_version": 0, "reward": None,
            **extra}


def write(path, samples):
    path.write_text("".join(json.dumps(s) + "\n" for s in samples))
    return path


def test_three_rules_on_hand_picked_responses(tmp_path, capsys):
    base = write(tmp_path / "base.samples.jsonl", [
        sample("9 + 9 = 18\n#### 18"),            # all three
        sample("So the answer is 18"),             # flexible (last number) and lenient, not strict
        sample("Step 1: 9 + 9 = 18", finish="length"),  # flexible only: lenient never credits a cut one
        sample("The answer is 18."),                # lenient only: verl keeps the full stop ("18.")
        sample("#### 17"),                          # none
    ])
    assert main([f"base={base}", "--fn", "gsm8k", "--fn", "gsm8k_flexible", "--fn", "gsm8k_lenient",
                 "--out", str(tmp_path / "t")]) == 0
    rows = json.loads((tmp_path / "t.json").read_text())
    assert [(r["label"], {fn: x["correct"] for fn, x in r["by_fn"].items()}) for r in rows] == [
        ("base", {"gsm8k": 1, "gsm8k_flexible": 3, "gsm8k_lenient": 3})]
    md = (tmp_path / "t.md").read_text()
    assert "| base | 5 | 20.00 % (1) | 60.00 % (3) | 60.00 % (3) |" in md
    assert "`gsm8k` = " in md and md == capsys.readouterr().out


def test_val_jsonl_gives_a_row_per_step_or_the_step_asked(tmp_path, capsys):
    val = write(tmp_path / "val.jsonl", [sample("#### 18", step=0), sample("#### 1", step=0),
                                         sample("#### 18", step=40), sample("#### 18", step=40)])
    assert main([f"grpo={val}", "--fn", "gsm8k"]) == 0
    out = capsys.readouterr().out
    assert "| grpo@0 | 2 | 50.00 % (1) |" in out and "| grpo@40 | 2 | 100.00 % (2) |" in out
    assert main([f"grpo={val}@40", "--fn", "gsm8k"]) == 0
    assert "| grpo | 2 | 100.00 % (2) |" in capsys.readouterr().out
    assert main([f"grpo={val}@20", "--fn", "gsm8k"]) == 2
    assert "no samples of step 20 (steps: [0, 40])" in capsys.readouterr().err


def test_bad_inputs_are_one_line(tmp_path, capsys):
    assert main([str(tmp_path / "x.jsonl"), "--fn", "gsm8k"]) == 2
    assert "inputs are LABEL=PATH" in capsys.readouterr().err
    bad = write(tmp_path / "bad.jsonl", [{"response": "#### 1"}])
    assert main([f"b={bad}", "--fn", "gsm8k"]) == 2
    assert "sample 1 lacks data_source, ground_truth, finish_reason" in capsys.readouterr().err
    good = write(tmp_path / "good.jsonl", [sample("#### 18")])
    assert main([f"g={good}", "--fn", "no_such_rule"]) == 2
    assert "Traceback" not in capsys.readouterr().err
