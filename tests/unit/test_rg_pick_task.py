"""bench/rg_pick_task.py: the reasoning-gym recipe's task, picked from the base model's accuracies."""
import pytest

from bench.rg_pick_task import pick_task, task_accuracies

pytestmark = pytest.mark.unit


def test_the_task_in_the_band_nearest_15_percent():
    # |0.06-0.15| = 0.09, |0.22-0.15| = 0.07: gcd; 0.40 and 0.02 are out of the 5-30 % band
    assert pick_task({"chain_sum": 0.40, "products": 0.06, "gcd": 0.22, "count_bits": 0.02}) == "gcd"


def test_the_band_edges_count():
    assert pick_task({"a": 0.05, "b": 0.31}) == "a"
    assert pick_task({"a": 0.30, "b": 0.0}) == "a"


def test_none_in_the_band_takes_the_best_solved_below_it():
    assert pick_task({"a": 0.0, "b": 0.01, "c": 0.035, "d": 0.9}) == "c"


def test_none_solved_is_an_error_naming_the_accuracies():
    with pytest.raises(ValueError, match=r"solves none of the tasks: a 0.0%, b 0.0%"):
        pick_task({"b": 0.0, "a": 0.0})


def test_accuracies_from_an_eval_report():
    report = {"by_source": {"reasoning_gym/chain_sum": {"accuracy": 0.125},
                            "reasoning_gym/gcd": {"accuracy": None},  # every reward failed
                            "openai/gsm8k": {"accuracy": 0.5}}}
    assert task_accuracies(report) == {"chain_sum": 0.125, "gcd": 0.0}
