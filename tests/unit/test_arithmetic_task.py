"""`rlfleet data arithmetic`: generated problems in GSM8K's answer format, their split, and their rule."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from rlfleet.app.cli import main
from rlfleet.data import arithmetic
from rlfleet.data.arithmetic import ArithmeticSpec, Problem
from rlfleet.errors import ConfigError, DataError
from rlfleet.rpc import convert
from rlfleet.types import ScoreItem
from services.reward.fns import final_number
from services.reward.scorer import RewardScorer

pytestmark = pytest.mark.unit


def test_rows_follow_the_verl_schema_and_answers_are_right():
    rows = arithmetic.make_rows(200, seed=3)
    assert len(rows) == 200
    for row in rows:
        assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
        assert row["data_source"] == "rlfleet/arithmetic"
        assert row["prompt"][0]["role"] == "user" and row["prompt"][0]["content"].endswith('after "####".')
        worked = row["extra_info"]["answer"]
        truth = row["reward_model"]["ground_truth"]
        assert worked.endswith(f"#### {truth}")
        # every line of the worked answer is true arithmetic: "a op b = c"
        for line in worked.splitlines()[:-1]:
            left, right = line.split(" = ")
            a, op, b = left.split(" ")
            assert eval(f"{a}{op}{b}") == int(right)  # noqa: S307 - digits and one operator only
        assert int(truth) >= 0
        assert final_number.compute_score("rlfleet/arithmetic", worked, truth) == 1.0
    ops = {row["extra_info"]["answer"].split()[1] for row in rows}
    assert ops == {"+", "-", "*"}
    assert arithmetic.make_rows(200, seed=3) == rows  # deterministic
    assert arithmetic.make_rows(200, seed=4) != rows


def test_problem_worked_answer_by_hand():
    assert Problem("sub", (50, 8, 12)).worked_answer() == "50 - 8 = 42\n42 - 12 = 30\n#### 30"
    assert Problem("mul", (3, 4, 5)).result == 60


def test_train_and_test_never_share_a_problem_whatever_the_seeds():
    spec = ArithmeticSpec(operations=("add",), min_operands=2, max_operands=2, max_value=40)
    train = arithmetic.make_rows(600, seed=0, split="train", spec=spec) + arithmetic.make_rows(
        600, seed=1, split="train", spec=spec
    )
    test = arithmetic.make_rows(100, seed=0, split="test", spec=spec)
    train_exprs = {arithmetic.Problem("add", tuple(map(int, r["extra_info"]["answer"].split()[0:3:2])))
                   .expression for r in train}
    test_exprs = {arithmetic.Problem("add", tuple(map(int, r["extra_info"]["answer"].split()[0:3:2])))
                  .expression for r in test}
    assert len(test_exprs) == 100  # distinct within a split
    assert not train_exprs & test_exprs


def test_options_shape_the_problems():
    spec = ArithmeticSpec(operations=("mul",), min_operands=3, max_operands=3, min_value=2, mul_max_value=5)
    for row in arithmetic.make_rows(30, spec=spec):
        operands = row["extra_info"]["answer"].splitlines()
        assert len(operands) == 3 and " * " in operands[0]
        first = operands[0].split(" = ")[0].split(" * ")
        assert all(2 <= int(x) <= 5 for x in first)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"spec": ArithmeticSpec(operations=("div",))}, "--operations"),
        ({"spec": ArithmeticSpec(min_operands=1)}, "--min-operands"),
        ({"spec": ArithmeticSpec(min_value=50, max_value=10)}, "--min-value"),
        ({"split": "validation"}, "--split"),
        ({"rows": 0}, "--rows"),
    ],
)
def test_bad_options_name_the_option(kwargs, words):
    with pytest.raises(ConfigError, match=words):
        arithmetic.make_rows(kwargs.pop("rows", 5), **kwargs)


def test_too_many_rows_for_the_option_space_is_a_clear_error():
    spec = ArithmeticSpec(operations=("add",), min_operands=2, max_operands=2, max_value=3)
    with pytest.raises(DataError, match="distinct train problems"):
        arithmetic.make_rows(50, spec=spec)


def test_cli_writes_parquet(tmp_path, capsys):
    out = tmp_path / "a.parquet"
    assert main(["data", "arithmetic", "-o", str(out), "--rows", "12", "--split", "test",
                 "--operations", "add,sub", "--seed", "7"]) == 0
    rows = pq.read_table(out).to_pylist()
    assert len(rows) == 12 and all(r["extra_info"]["split"] == "test" for r in rows)
    assert "wrote 12 test rows" in capsys.readouterr().out
    assert main(["data", "arithmetic", "-o", str(out), "--operations", "pow"]) == 2
    assert "--operations" in capsys.readouterr().err


@pytest.mark.parametrize(
    "response, finish, expected",
    [
        ("2 + 3 = 5\n#### 5", "stop", 1.0),
        ("2 + 3 = 5. The answer is 5.", "stop", 1.0),  # no ####: the last number of a finished response
        ("2 + 3 = 5. The answer is 5.", "", 1.0),  # unknown ending: scored as finished
        ("Step 1: 2 + 3 = 5\nStep 5", "length", 0.0),  # cut at the budget: never credited
        ("2 + 3 = 5\n#### 5\nQuestion: 2 + 3", "length", 0.0),  # not even after ####
        ("#### 6", "stop", 0.0),
    ],
)
def test_arithmetic_rule_through_the_scorer(response, finish, expected):
    scorer = RewardScorer("auto")
    item = ScoreItem("a", "rlfleet/arithmetic", "p", response, "5", {"index": 1}, finish_reason=finish)
    assert scorer.score([item])[0].score == expected
    assert item.extra_info == {"index": 1}  # the row's extra_info is not changed


def test_finish_reason_crosses_the_reward_proto():
    items = [ScoreItem("a", "s", "p", "r", "1", {"k": 1}, finish_reason="length"),
             ScoreItem("b", "s", "p", "r", "1")]
    back = convert.score_items_from_proto(convert.score_items_to_proto(items))
    assert [i.finish_reason for i in back] == ["length", ""]
    assert back == items


# ---- the hard level: chains a calculator decides ---------------------------------------------------
def test_hard_chain_by_hand():
    from rlfleet.data.arithmetic_hard import Chain

    # (4821 + 376) * 1290 + 5512: the running sum is parenthesized before the product
    chain = Chain((4821, 376, 1290, 5512), ("add", "mul", "add"))
    assert chain.expression == "(4821 + 376) * 1290 + 5512"
    # 4821 + 376 = 5197; 5197 * 1290 = 6704130; 6704130 + 5512 = 6709642
    assert chain.worked_answer() == ("4821 + 376 = 5197\n5197 * 1290 = 6704130\n6704130 + 5512 = 6709642\n"
                                     "#### 6709642")
    assert Chain((120, 305, 999), ("mul", "add")).expression == "120 * 305 + 999"  # no parentheses needed
    assert Chain((120, 305, 999), ("mul", "mul")).expression == "120 * 305 * 999"


def test_hard_rows_are_products_and_sums_of_3_to_4_digit_numbers_in_gsm8k_format():
    from environments.calculator import evaluate

    rows = arithmetic.make_rows(300, seed=0, level="hard")
    counts = set()
    for row in rows:
        info = row["extra_info"]
        truth = row["reward_model"]["ground_truth"]
        assert info["level"] == "hard" and row["data_source"] == "rlfleet/arithmetic"
        lines = info["answer"].splitlines()
        assert lines[-1] == f"#### {truth}"
        symbols = [line.split()[1] for line in lines[:-1]]
        assert "+" in symbols and 1 <= symbols.count("*") <= 2
        counts.add(len(lines) - 1)
        question = info["question"]  # "What is EXPR?", "Compute EXPR.", ...
        expression = question[min(question.find(c) for c in "(123456789" if c in question):].rstrip("?.")
        operands = [int(t) for t in expression.replace("(", " ").replace(")", " ").split() if t.isdigit()]
        assert len(operands) == len(lines) and all(100 <= x <= 9999 for x in operands)
        assert evaluate(expression) == int(truth)  # the calculator, given the question, gets it right
        assert final_number.compute_score("rlfleet/arithmetic", info["answer"], truth) == 1.0
    assert counts == {2, 3}  # 3 and 4 numbers
    assert arithmetic.make_rows(300, seed=0, level="hard") == rows


def test_hard_train_and_test_are_disjoint():
    train = arithmetic.make_rows(2000, seed=0, split="train", level="hard")
    test = arithmetic.make_rows(300, seed=0, split="test", level="hard")
    train_q = {r["extra_info"]["answer"].splitlines()[0] + r["reward_model"]["ground_truth"] for r in train}
    test_q = {r["extra_info"]["answer"].splitlines()[0] + r["reward_model"]["ground_truth"] for r in test}
    assert len(test_q) == 300 and not train_q & test_q
    assert all(arithmetic.split_of(_chain(r)) == "test" for r in test)
    assert all(arithmetic.split_of(_chain(r)) == "train" for r in train)


def _chain(row):
    from rlfleet.data.arithmetic_hard import Chain

    lines = row["extra_info"]["answer"].splitlines()[:-1]
    operands = [int(lines[0].split()[0])] + [int(line.split()[2]) for line in lines]
    operations = tuple("add" if line.split()[1] == "+" else "mul" for line in lines)
    return Chain(tuple(operands), operations)


def test_hard_level_from_the_command_line(tmp_path, capsys):
    out = tmp_path / "hard.parquet"
    assert main(["data", "arithmetic", "--level", "hard", "--rows", "5", "--output", str(out)]) == 0
    assert "5 train rows (rlfleet/arithmetic, hard)" in capsys.readouterr().out
    rows = pq.read_table(out).to_pylist()
    assert [r["extra_info"]["level"] for r in rows] == ["hard"] * 5
    with pytest.raises(SystemExit):
        main(["data", "arithmetic", "--level", "medium", "--output", str(out)])
