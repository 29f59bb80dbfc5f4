"""reasoning-gym tasks: `rlfleet data reasoning-gym` rows, their split, and `reward.fn=reasoning_gym`
(the task's own verifier), on three tasks."""
from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from rlfleet.app.cli import main
from rlfleet.data import reasoning_gym as rg_data
from rlfleet.errors import ConfigError
from rlfleet.types import ScoreItem
from services.reward.fns import reasoning_gym as rg_reward
from services.reward.registry import rule_label
from services.reward.scorer import RewardScorer

pytestmark = pytest.mark.unit

TASKS = ["chain_sum", "leg_counting", "spell_backward"]


def test_rows_follow_the_verl_schema_interleaving_the_tasks():
    rows = rg_data.make_rows(TASKS, 7, seed=1)
    assert [r["data_source"] for r in rows] == [f"reasoning_gym/{t}" for t in TASKS * 2 + TASKS[:1]]
    for row in rows:
        assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
        entry = json.loads(row["extra_info"]["entry"])
        assert row["reward_model"]["ground_truth"] == str(entry["answer"])
        assert row["prompt"][0]["content"] == f"{entry['question'].rstrip()}\n\n{rg_data.INSTRUCTION}"
        assert row["extra_info"]["task"] == row["data_source"].split("/")[1]
    assert rg_data.make_rows(TASKS, 7, seed=1) == rows  # deterministic
    assert rg_data.make_rows(TASKS, 7, seed=2) != rows


def test_train_and_test_never_share_a_question_whatever_the_seeds():
    train = rg_data.make_rows(["chain_sum"], 150, seed=0) + rg_data.make_rows(["chain_sum"], 150, seed=5)
    test = rg_data.make_rows(["chain_sum"], 100, seed=0, split="test")
    question = lambda r: json.loads(r["extra_info"]["entry"])["question"]  # noqa: E731
    assert len({question(r) for r in test}) == 100  # distinct within a split
    assert not {question(r) for r in train} & {question(r) for r in test}


@pytest.mark.parametrize("task", TASKS)
def test_the_tasks_verifier_scores_through_auto_and_by_name(task, tmp_path):
    out = tmp_path / f"{task}.parquet"
    assert main(["data", "reasoning-gym", task, "--rows", "3", "-o", str(out), "--split", "test"]) == 0
    rows = pq.read_table(out).to_pylist()  # what training reads back: extra_info as Parquet stored it
    assert len(rows) == 3
    for fn in ("auto", "reasoning_gym"):
        scorer = RewardScorer(fn)
        for i, row in enumerate(rows):
            truth = row["reward_model"]["ground_truth"]
            items = [ScoreItem(f"{i}r", row["data_source"], "p", f"Let me see.\n<answer>{truth}</answer>",
                               truth, row["extra_info"]),
                     ScoreItem(f"{i}w", row["data_source"], "p", "<answer>xyz</answer>", truth,
                               row["extra_info"]),
                     ScoreItem(f"{i}l", row["data_source"], "p", f"thinking...\n{truth}\n", truth,
                               row["extra_info"])]
            right, wrong, last_line = (r.score for r in scorer.score(items))
            assert (right, wrong, last_line) == (1.0, 0.0, 1.0), (task, fn, truth)
    assert rule_label("auto", f"reasoning_gym/{task}") == "reasoning_gym"


def test_tags_can_be_required_and_a_row_without_an_entry_scores_against_the_ground_truth():
    assert rg_reward.compute_score("reasoning_gym/chain_sum", "7", "7", {}) == 1.0
    assert rg_reward.compute_score("reasoning_gym/chain_sum", "7", "7", {}, require_tags=True) == 0.0
    assert rg_reward.extract_answer("<answer>1</answer> then <answer> 2 </answer>") == "2"


def test_unknown_tasks_are_one_line_errors(capsys):
    with pytest.raises(ConfigError, match="unknown reasoning-gym task.*no_such_task"):
        rg_data.parse_tasks("chain_sum,no_such_task")
    assert main(["data", "reasoning-gym", "no_such_task", "-o", "/tmp/never.parquet"]) == 2
    err = capsys.readouterr().err
    assert "no_such_task" in err and "Traceback" not in err
    with pytest.raises(ConfigError, match="--split"):
        rg_data.make_rows(["chain_sum"], 3, split="validation")
    item = ScoreItem("x", "reasoning_gym/", "p", "1", "1")
    result = RewardScorer("reasoning_gym").score([item])[0]
    assert not result.ok and "names no reasoning-gym task" in result.error


def test_rows_carry_the_answer_written_as_the_instruction_asks_for_a_warm_start():
    """`extra_info.answer` is what `rlfleet sft` trains on by default (its --response-key): the answer
    between the tags the default instruction asks for, the bare answer under another instruction."""
    for row in rg_data.make_rows(["chain_sum", "spell_backward"], 4, seed=3):
        truth = row["reward_model"]["ground_truth"]
        assert row["extra_info"]["answer"] == f"<answer>{truth}</answer>"
        item = ScoreItem("0", row["data_source"], "p", row["extra_info"]["answer"], truth, row["extra_info"])
        assert RewardScorer("reasoning_gym").score([item])[0].score == 1.0  # the verifier's full marks
    for row in rg_data.make_rows(["chain_sum"], 2, seed=3, instruction="Reply with the number."):
        assert row["extra_info"]["answer"] == row["reward_model"]["ground_truth"]
    for row in rg_data.make_rows(["chain_sum"], 2, seed=3, instruction=""):
        assert row["extra_info"]["answer"] == row["reward_model"]["ground_truth"]
