"""Built-in rewards, the reward-source config, and the circuit breaker (pure, no processes)."""
from __future__ import annotations

import math
import re

import pytest

from rlfleet.config import load_config
from rlfleet.errors import ConfigError, InvalidRequest
from rlfleet.types import ScoreItem
from services.reward.fns import match, math_answer, penalties
from services.reward.registry import builtin_functions, load_function, named_functions
from services.reward.scorer import RewardScorer
from services.reward.sources.breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreaker

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("response, truth, expected", [
    ("so the answer is $\\boxed{\\frac{1}{2}}$", "0.5", 1.0),
    ("The answer is 0.5", "\\frac{1}{2}", 1.0),
    ("$\\sqrt{8}$", "2\\sqrt{2}", 1.0),
    ("$x = 3$", "3", 1.0),
    ("The answer is 3", "\\frac{1}{2}", 0.0),
    ("I do not know", "7", 0.0),
])
def test_math_answer_equivalence(response, truth, expected):
    assert math_answer.compute_score("math", response, truth) == expected


def test_math_unparseable_ground_truth_raises():
    with pytest.raises(ValueError, match="ground truth"):
        math_answer.compute_score("math", "42", "")


def test_exact_and_regex_match():
    assert match.exact_match("", "  Paris \n", "Paris") == 1.0
    assert match.exact_match("", "paris", "Paris") == 0.0
    assert match.exact_match("", "paris", "Paris", case_sensitive=False) == 1.0
    assert match.exact_match("", "thinking...\nParis\n", "Paris", last_line=True) == 1.0
    assert match.regex_match("", "Answer: 42.", "42", pattern=r"Answer:\s*(\d+)") == 1.0
    assert match.regex_match("", "Answer: 41.", "42", pattern=r"Answer:\s*(\d+)") == 0.0
    assert match.regex_match("", "no answer", "42", pattern=r"Answer:\s*(\d+)") == 0.0
    assert match.regex_match("", " 2024-01-31 ", r"\d{4}-\d{2}-\d{2}") == 1.0
    with pytest.raises(re.error):
        match.regex_match("", "x", "(unclosed")


def test_format_and_length_penalties():
    good = "<think>2+2 is 4</think>\n<answer>4</answer>"
    assert penalties.format_reward("", good, "") == 1.0
    assert penalties.format_reward("", "4", "", penalty=-1.0) == -1.0
    # max_length 10, buffer 4: free up to 6 chars, then -(len-6)/4, and -1 from 10 on.
    assert [penalties.length_penalty("", "x" * n, "", max_length=10, buffer=4) for n in (6, 7, 8, 10, 50)] \
        == [0.0, -0.25, -0.5, -1.0, -1.0]
    assert penalties.length_penalty("", "a b c d", "", max_length=4, buffer=2, unit="words") == -1.0
    with pytest.raises(ValueError, match="buffer"):
        penalties.length_penalty("", "x", "", max_length=4, buffer=0)


def test_registry_names_and_params():
    assert {"gsm8k", "math", "exact_match", "regex_match", "format", "length_penalty", "code", "digits"} \
        <= set(named_functions())
    assert builtin_functions()["HuggingFaceH4/MATH-500"] is named_functions()["math"]
    fn = load_function("length_penalty", {"max_length": 2, "buffer": 1})
    assert fn("", "xyz", "", None) == -1.0
    with pytest.raises(ConfigError, match="built-in name"):
        load_function("no_such_reward")
    with pytest.raises(ConfigError, match="cannot import"):
        load_function("no_such_module:fn")


def test_scorer_takes_callables_and_refuses_empty_or_duplicate_ids():
    scorer = RewardScorer(lambda ds, resp, truth, extra: len(resp))
    item = ScoreItem(id="a", data_source="x", prompt="", response="abc", ground_truth="")
    assert scorer.score([item])[0].score == 3.0
    with pytest.raises(InvalidRequest, match="empty id"):
        scorer.score([ScoreItem(id="", data_source="x", prompt="", response="", ground_truth="")])
    with pytest.raises(InvalidRequest, match="duplicate"):
        scorer.score([item, item])
    calls = iter([True, False])
    with pytest.raises(TimeoutError, match="1 of 2"):
        scorer.score([item, ScoreItem(id="b", data_source="x", prompt="", response="", ground_truth="")],
                     active=lambda: next(calls))


def test_reward_sources_config():
    cfg = load_config(None, [("reward.sources=[{name: ext, address: '127.0.0.1:5'}, "
                              "{name: len, function: length_penalty, params: {max_length: 9}, "
                              "weight: -0.5}]")])
    assert [s.name for s in cfg.reward.sources] == ["ext", "len"]
    assert cfg.reward.sources[1].params == {"max_length": 9} and cfg.reward.sources[1].weight == -0.5
    for bad, needle in [
        ("[{name: a}]", "exactly one of"),
        ("[{name: a, address: 'h:1', function: gsm8k}]", "exactly one of"),
        ("[{name: a, function: gsm8k}, {name: a, address: 'h:1'}]", "duplicate names"),
        ("[{name: 'a b', function: gsm8k}]", "letters, digits"),
        ("[{name: a, address: 'h:1', params: {x: 1}}]", "params apply only"),
        ("[{name: a, address: 'h:1', timeout_s: 0}]", "reward.sources.0.timeout_s"),
        ("[{name: a, address: 'h:1', retries: 2}]", "reward.sources.0.retries"),
    ]:
        with pytest.raises(ConfigError, match=needle):
            load_config(None, [f"reward.sources={bad}"])


def test_reward_model_config():
    cfg = load_config(None, ["reward.model.path=/models/rm", "reward.model.device=cuda:2",
                             "reward.model.batch_size=4"])
    assert (cfg.reward.model.path, cfg.reward.model.device,
            cfg.reward.model.batch_size) == ("/models/rm", "cuda:2", 4)
    with pytest.raises(ConfigError, match="reward.model.batch_size"):
        load_config(None, ["reward.model.batch_size=0"])


def test_circuit_breaker_opens_probes_and_closes():
    now = [0.0]
    breaker = CircuitBreaker(failures=3, cooldown_s=10.0, clock=lambda: now[0])
    for _ in range(2):
        assert breaker.allow() == CLOSED
        breaker.record_failure()
    breaker.record_success()  # a success resets the count
    for _ in range(3):
        assert breaker.allow() == CLOSED
        breaker.record_failure()
    assert breaker.state == OPEN and breaker.allow() is None and breaker.opened_count == 1
    assert breaker.retry_in_s() == pytest.approx(10.0)
    now[0] = 10.0
    assert breaker.state == HALF_OPEN
    assert breaker.allow() == HALF_OPEN and breaker.allow() is None  # one probe at a time
    breaker.record_failure()  # the probe failed: open for another cool-down
    assert breaker.state == OPEN and breaker.opened_count == 2
    now[0] = 20.0
    assert breaker.allow() == HALF_OPEN
    breaker.record_success()
    assert breaker.state == CLOSED and breaker.allow() == CLOSED
    assert math.isclose(breaker.retry_in_s(), 0.0)
