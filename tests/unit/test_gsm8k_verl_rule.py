"""GSM8K scored as verl's `compute_score` scores it (strict, flexible), beside rlfleet's lenient rule.

Each row is a hand-picked response showing one difference between the three rules;
the expected values follow verl's code read line by line (last 300 characters;
strict: the last '#### N' with N in [-0-9.,]+, commas removed; flexible: the last
such run that is not a lone '.', as it stands; then string equality).
"""

from __future__ import annotations

import pytest

from rlfleet.types import ScoreItem
from services.reward.fns import final_number, gsm8k
from services.reward.registry import load_function, rule_label
from services.reward.scorer import RewardScorer

pytestmark = pytest.mark.unit

STOP, CUT = {"finish_reason": "stop"}, {"finish_reason": "length"}


@pytest.mark.parametrize(
    "response, truth, extra, strict, flexible, lenient",
    [
        # the well-formed answer: all three agree
        ("3 * 6 = 18\n#### 18", "18", STOP, 1.0, 1.0, 1.0),
        # a full stop after the number: verl does not strip it ("18." != "18")
        ("3 * 6 = 18\n#### 18.", "18", STOP, 0.0, 0.0, 1.0),
        ("So she earns 18.", "18", STOP, 0.0, 0.0, 1.0),
        # no ####: strict has no answer; flexible takes the last number; lenient too
        ("So she earns 18 dollars", "18", STOP, 0.0, 1.0, 1.0),
        # no space after ####: not verl's marker
        ("####18", "18", STOP, 0.0, 1.0, 1.0),
        # commas: strict removes them, flexible keeps them
        ("#### 1,234", "1234", STOP, 1.0, 0.0, 1.0),
        ("That is 1,234 in all", "1234", STOP, 0.0, 0.0, 1.0),
        # $: not part of verl's number, so '#### $18' has no strict answer
        ("#### $18", "18", STOP, 0.0, 1.0, 1.0),
        ("It costs $18 in total", "18", STOP, 0.0, 1.0, 1.0),
        # value vs text: 18.00 is not 18 for verl
        ("#### 18.00", "18", STOP, 0.0, 0.0, 1.0),
        # the last marker wins
        ("#### 5 wait, no\n#### 18", "18", STOP, 1.0, 1.0, 1.0),
        # negative numbers
        ("#### -3", "-3", STOP, 1.0, 1.0, 1.0),
        # verl reads only the last 300 characters
        ("#### 18\n" + "and so on. " * 30, "18", STOP, 0.0, 0.0, 1.0),
        # cut at the token budget: a coincidental number; lenient never credits it, verl knows no budget
        ("Step 1: add the apples.\nStep 5", "5", CUT, 0.0, 1.0, 0.0),
        ("3 * 6 = 18\n#### 18\nQuestion: what", "18", CUT, 1.0, 1.0, 0.0),
        # nothing to read
        ("I do not know", "18", STOP, 0.0, 0.0, 0.0),
    ],
)
def test_each_rule_on_hand_picked_responses(response, truth, extra, strict, flexible, lenient):
    assert gsm8k.compute_score("openai/gsm8k", response, truth, extra) == strict
    assert gsm8k.compute_score_flexible("openai/gsm8k", response, truth, extra) == flexible
    assert final_number.compute_score("openai/gsm8k", response, truth, extra) == lenient


def test_extraction_as_verl_reads_it():
    assert gsm8k.extract_answer("x #### 1,234,567 y") == "1234567"
    assert gsm8k.extract_answer("no marker 42") is None
    assert gsm8k.extract_answer("ends with 42.", "flexible") == "42."
    assert gsm8k.extract_answer("a 7 then . only", "flexible") == "7"  # a lone "." is skipped
    assert gsm8k.extract_answer("just . and .", "flexible") == "."  # verl's loop ends on the first one
    assert gsm8k.extract_answer("no digits", "flexible") is None


def test_format_score_and_score_params():
    # verl's defaults: format_score 0, score 1; a found but wrong answer earns format_score
    assert gsm8k.compute_score("s", "#### 17", "18", format_score=0.1) == 0.1
    assert gsm8k.compute_score("s", "no answer", "18", format_score=0.1) == 0.0
    assert gsm8k.compute_score("s", "#### 18", "18", score=2.0) == 2.0
    assert load_function("gsm8k", {"method": "flexible"})("s", "total 18", "18") == 1.0
    with pytest.raises(ValueError, match="method"):
        gsm8k.compute_score("s", "#### 18", "18", method="fuzzy")
    assert gsm8k.compute_score("s", None, "18") == 0.0


def test_auto_and_names_pick_the_rules():
    item = ScoreItem("a", "openai/gsm8k", "p", "So she earns 18.", "18", finish_reason="stop")
    assert RewardScorer("auto").score([item])[0].score == 0.0  # verl strict by default
    assert RewardScorer("gsm8k_lenient").score([item])[0].score == 1.0
    cut = ScoreItem("b", "openai/gsm8k", "p", "So she earns 18", "18", finish_reason="length")
    assert RewardScorer("gsm8k_flexible").score([cut])[0].score == 1.0
    assert RewardScorer("gsm8k_lenient").score([cut])[0].score == 0.0


def test_reports_name_the_rule():
    assert rule_label("auto", "openai/gsm8k").startswith("gsm8k (verl strict")
    assert rule_label("gsm8k_flexible", "openai/gsm8k").startswith("gsm8k_flexible (verl flexible")
    assert rule_label("auto", "rlfleet/arithmetic").startswith("arithmetic (")
    assert rule_label("mypkg.rewards:score", "x") == "mypkg.rewards:score"
    assert rule_label("auto", "digits_reverse") == "digits"
