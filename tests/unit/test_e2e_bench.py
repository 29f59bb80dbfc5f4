"""bench/e2e_grpo.py's arithmetic: throughput from the end of the warm-up step to the end of the last."""
from bench.e2e_common import ArmResult, StepRecord, format_table


def test_measured_excludes_warmup_steps():
    # steps end at t = 10, 12, 13, 15 s; warm-up 1 -> window 10 s .. 15 s = 5 s over steps 2-4:
    # 3 x 8 samples = 24 samples / 5 s = 4.8/s; tokens 3 x 100 = 300 / 5 s = 60/s.
    steps = [StepRecord(1, 10.0, 8, 999), StepRecord(2, 12.0, 8, 100), StepRecord(3, 13.0, 8, 100),
             StepRecord(4, 15.0, 8, 100)]
    m = ArmResult("x", steps, total_s=20.0).measured(warmup=1)
    assert m["steps"] == 3 and m["wall_s"] == 5.0
    assert m["samples_per_s"] == 4.8 and m["gen_tokens_per_s"] == 60.0 and m["mean_len"] == 12.5


def test_measured_needs_the_warmup_step_and_a_later_one():
    assert ArmResult("x", [StepRecord(1, 1.0, 8, 10)], 2.0).measured(warmup=1) == {}
    assert ArmResult("x", [StepRecord(2, 1.0, 8, 10)], 2.0).measured(warmup=1) == {}


def test_table_ratio_is_against_trl():
    trl = ArmResult("trl", [StepRecord(1, 0.0, 1, 10), StepRecord(2, 1.0, 1, 10)], 5.0)
    fast = ArmResult("rlfleet-async", [StepRecord(1, 0.0, 1, 10), StepRecord(2, 0.5, 1, 10)], 5.0)
    table = format_table([fast, trl], warmup=1)
    assert "| 2.00x |" in table and "| 1.00x |" in table


def test_trl_arm_scores_with_rlfleets_rule_and_knows_truncation():
    # bench/gsm8k_trl.py's reward: rlfleet's core for reward.fn, a completion not ending on an EOS is cut
    from bench.gsm8k_trl import make_reward

    eos, rewards = {2}, []
    reward = make_reward("auto", eos, rewards)
    scores = reward(
        prompts=["p"] * 3, completions=[[{"content": "#### 5"}]] * 3, ground_truth=["5", "5", "6"],
        data_source=["rlfleet/arithmetic", "rlfleet/arithmetic", "openai/gsm8k"],
        extra_info_json=["{}"] * 3, completion_ids=[[7, 8, 2], [7, 8, 9], [7, 2]],
    )
    # ended on EOS: 1; cut at the budget: 0 (arithmetic never credits it); gsm8k (verl strict) wrong: 0
    assert scores == [1.0, 0.0, 0.0] and rewards == scores


def test_trl_save_steps_option():
    import argparse

    import pytest

    from bench.gsm8k_trl import save_steps

    assert save_steps("40,20,60,20") == (20, 40, 60)
    for bad in ("20,x", "0,20", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="--save-steps wants"):
            save_steps(bad)


def test_jsonl_follower_returns_each_complete_line_once_and_keeps_a_partial_one(tmp_path):
    """The benches follow a run's metrics.jsonl while it is written: a line is read once, and only
    when complete (a half-written line would not parse)."""
    from bench.e2e_common import JsonlFollower

    path = tmp_path / "metrics.jsonl"
    follower = JsonlFollower(path)
    assert follower.new_lines() == []  # not written yet
    path.write_text('{"step": 1}\n{"step": 2')
    assert follower.new_lines() == [{"step": 1}]
    with open(path, "a") as f:
        f.write(', "x": 3}\n')
    assert follower.new_lines() == [{"step": 2, "x": 3}]
    assert follower.new_lines() == []
