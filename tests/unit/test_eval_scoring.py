"""Evaluation aggregation: pass@k, accuracy by data_source, the report table. Numbers derived by hand."""

from __future__ import annotations

import json

import pytest

from rlfleet.eval.report import format_table, write_report
from rlfleet.eval.scoring import EvalSample, default_ks, flat_metrics, pass_at_k, summarize

pytestmark = pytest.mark.unit


def sample(prompt, i, reward, source="a", length=4):
    return EvalSample(
        prompt_index=prompt,
        data_source=source,
        sample=i,
        prompt="p",
        response="r",
        ground_truth="g",
        length=length,
        finish_reason="stop",
        policy_version=0,
        reward=reward,
    )


def test_pass_at_k_by_hand():
    # n=4, c=1, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    # n=5, c=2, k=3: 1 - C(3,3)/C(5,3) = 1 - 1/10
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9)
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)  # pass@1 is the fraction correct
    assert pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(4, 3, 2) == 1.0  # fewer than k wrong samples: any k contain a correct one
    with pytest.raises(ValueError):
        pass_at_k(2, 3, 1)


def test_default_ks():
    assert default_ks(1) == [1]
    assert default_ks(4) == [1, 2, 4]
    assert default_ks(6) == [1, 2, 4, 6]


def test_summarize_by_source_by_hand():
    samples = [
        # source a, prompt 0: 1 of 2 correct; prompt 1: 0 of 2 (one reward failed, left out)
        sample(0, 0, 1.0),
        sample(0, 1, 0.5),
        sample(1, 0, 0.0, length=8),
        sample(1, 1, None, length=2),
        # source b, prompt 2: 2 of 2 correct
        sample(2, 0, 1.0, "b"),
        sample(2, 1, 1.0, "b"),
    ]
    s = summarize(samples, n=2)
    a, b, overall = s["by_source"]["a"], s["by_source"]["b"], s["overall"]
    assert (a["prompts"], a["samples"], a["reward_failed"]) == (2, 4, 1)
    assert a["accuracy"] == pytest.approx(1 / 3)  # 1 correct of 3 scored
    assert a["reward_mean"] == pytest.approx(1.5 / 3)
    assert a["response_length_mean"] == pytest.approx((4 + 4 + 8 + 2) / 4)
    # pass@2 only over prompts with 2 scored samples: prompt 0 (c=1, n=2 -> 1)
    assert a["pass@2"] == pytest.approx(1.0)
    # pass@1: prompt 0 -> 0.5, prompt 1 (n=1, c=0) -> 0
    assert a["pass@1"] == pytest.approx(0.25)
    assert b["accuracy"] == 1.0 and b["pass@2"] == 1.0
    assert overall["accuracy"] == pytest.approx(3 / 5)
    flat = flat_metrics(s)
    assert flat["val/a/accuracy"] == pytest.approx(1 / 3)
    assert flat["val/b/pass@2"] == 1.0
    assert flat["val/accuracy"] == pytest.approx(3 / 5)
    assert flat["val/a/reward_failed"] == 1.0
    assert "val/a/pass@1" not in flat  # pass@1 is accuracy


def test_correct_at_threshold():
    samples = [sample(0, 0, 0.8), sample(1, 0, 1.0)]
    assert summarize(samples, 1)["overall"]["accuracy"] == 0.5
    assert summarize(samples, 1, correct_at=0.75)["overall"]["accuracy"] == 1.0


def test_report_files_and_table(tmp_path):
    samples = [sample(0, 0, 1.0, "digits_reverse"), sample(1, 0, 0.0, "openai/gsm8k")]
    s = summarize(samples, 1)
    report, samples_path = write_report(tmp_path / "r.json", s, samples, {"model": "m"})
    data = json.loads(report.read_text())
    assert data["model"] == "m" and data["by_source"]["digits_reverse"]["accuracy"] == 1.0
    assert data["samples_file"] == "r.samples.jsonl"
    lines = [json.loads(x) for x in samples_path.read_text().splitlines()]
    assert [x["correct"] for x in lines] == [True, False]
    table = format_table(s).splitlines()
    assert table[0].split() == [
        "data_source",
        "prompts",
        "samples",
        "accuracy",
        "baseline",
        "pass@1",
        "reward",
        "length",
        "clipped",
        "failed",
        "distinct",
        "top",
    ]
    assert table[1].split()[:4] == ["digits_reverse", "1", "1", "1.0000"]
    assert table[2].split()[:4] == ["openai/gsm8k", "1", "1", "0.0000"]
    assert table[3].split()[:4] == ["all", "2", "2", "0.5000"]


def test_table_names_the_rule_of_each_source():
    from rlfleet.app.eval_command import reward_rules
    from rlfleet.config import load_config

    samples = [sample(0, 0, 1.0, "digits_reverse"), sample(1, 0, 0.0, "openai/gsm8k")]
    s = summarize(samples, 1)
    for src, rule in reward_rules(load_config(None, []), list(s["by_source"])).items():
        s["by_source"][src]["rule"] = rule
    table = format_table(s).splitlines()
    assert table[0].split()[-1] == "rule"
    assert table[1].endswith("  digits")
    assert table[2].endswith("  gsm8k (verl strict: '#### N' in the last 300 chars)")
    flexible = reward_rules(load_config(None, ["reward.fn=gsm8k_flexible"]), ["openai/gsm8k"])
    assert flexible["openai/gsm8k"].startswith("gsm8k_flexible (verl flexible")


def test_resolve_eval_model_takes_the_latest_complete_checkpoint(tmp_path):
    from rlfleet.errors import ConfigError
    from rlfleet.app.eval_command import resolve_eval_model

    run = tmp_path / "run"
    for step, complete in ((2, True), (10, True), (12, False)):  # step_12 has no meta.json: half written
        folder = run / "checkpoints" / f"step_{step}"
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
        if complete:
            (folder / "meta.json").write_text(json.dumps({"step": step}))
    assert resolve_eval_model(str(run)) == run / "checkpoints" / "step_10"
    assert resolve_eval_model(str(run / "checkpoints")) == run / "checkpoints" / "step_10"
    assert resolve_eval_model(str(run / "checkpoints" / "step_2")) == run / "checkpoints" / "step_2"
    with pytest.raises(ConfigError, match="not a model folder"):
        resolve_eval_model(str(tmp_path))


def test_episodes_report_turns_and_tool_calls_by_hand():
    import dataclasses

    # three episodes of source a: 1, 2 and 3 turns with 0, 1 and 2 tool calls (one an error), and one
    # single-turn sample of source b
    episodes = [dataclasses.replace(sample(0, i, 1.0), turns=i + 1, tool_calls=i, tool_errors=int(i == 2))
                for i in range(3)]
    summary = summarize([*episodes, sample(1, 0, 0.0, source="b")], n=3)
    a = summary["by_source"]["a"]
    assert a["turns_mean"] == pytest.approx(2.0)  # (1 + 2 + 3) / 3
    assert a["tool_calls_mean"] == pytest.approx(1.0) and a["tool_errors"] == 1  # (0 + 1 + 2) / 3
    assert "turns_mean" not in summary["by_source"]["b"]  # no episode there
    assert summary["overall"]["turns_mean"] == pytest.approx(1.5)  # (1 + 2 + 3 + 0) / 4
    metrics = flat_metrics(summary)
    assert metrics["val/a/turns/mean"] == pytest.approx(2.0) and "val/b/turns/mean" not in metrics
    header, row_a, row_b, _ = format_table(summary).splitlines()[:4]  # then collapse notes (all "r")
    assert header.split()[-2:] == ["turns", "tools"]
    assert row_a.split()[-2:] == ["2.00", "1.00"] and row_b.split()[-2:] == ["-", "-"]
    # single-turn samples alone: no such columns, no such metrics
    plain = summarize([sample(0, 0, 1.0)], n=1)
    assert "turns" not in format_table(plain) and not any("turns" in k for k in flat_metrics(plain))
