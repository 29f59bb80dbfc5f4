"""Malformed tool calls are counted (issue 42, 9): an episode that wrote `…</tool_calll` counted as 0
tool calls and 0 tool errors (a final answer). Now each tool-call opening that does not parse into a call
is a tool-format error, in the step's `env/tool_format_errors` and in `rlfleet eval`'s summary."""
from __future__ import annotations

import dataclasses

import pytest

from controller.episodes import env_metrics
from rlfleet.env.toolcalls import malformed_tool_calls
from rlfleet.eval.runner import _score_group
from rlfleet.eval.scoring import EvalSample, summarize
from rlfleet.data.prompts import Prompt
from rlfleet.types import Completion, GroupResult, ScoreResult, TurnRecord

pytestmark = pytest.mark.unit
GOOD = '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>'
MISSPELT = '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_calll'


def test_an_opening_without_its_closing_tag_is_a_format_error():
    assert malformed_tool_calls(GOOD) == 0
    assert malformed_tool_calls(MISSPELT) == 1
    assert malformed_tool_calls("the answer is 5") == 0
    assert malformed_tool_calls(GOOD + " then " + MISSPELT) == 1  # one of the two openings did not close
    assert malformed_tool_calls('<tool name="calculator">2+3</tol>') == 1  # the tagged format, misspelt
    assert malformed_tool_calls('<tool name="calculator">2+3</tool>') == 0
    assert malformed_tool_calls("<tool_call>{oops</tool_call>") == 0  # closed: a call (its JSON is the env's)


def _episode(*texts: str) -> Completion:
    return Completion(token_ids=[1, 2], logprobs=[0.0, 0.0], finish_reason="stop", policy_version=0,
                      turns=tuple(TurnRecord(2, 0, 0, 0, text=t) for t in texts))


def test_the_steps_env_metrics_count_them():
    # episode 1: a good call then a misspelt one (1); episode 2: two misspelt turns (2); episode 3: none
    metrics = env_metrics([_episode(GOOD, MISSPELT), _episode(MISSPELT, MISSPELT), _episode("5")])
    assert metrics["env/tool_format_errors"] == 3.0  # 1 + 2 + 0


def test_rlfleet_eval_counts_them_per_sample_and_in_its_summary():
    prompt = Prompt(index=0, text="p", prompt_ids=[1], data_source="a", ground_truth="5")
    group = GroupResult("r0", [_episode(GOOD, MISSPELT), _episode("5")])
    samples = _score_group(prompt, group, lambda items: [ScoreResult(i.id, 1.0) for i in items])
    assert [s.tool_format_errors for s in samples] == [1, 0]
    summary = summarize(samples, n=2)
    assert summary["by_source"]["a"]["tool_format_errors"] == 1
    # by hand: three episodes with 0, 2 and 1 format errors
    plain = EvalSample(prompt_index=0, data_source="b", sample=0, prompt="p", response="r", ground_truth="5",
                       length=1, finish_reason="stop", policy_version=0, reward=1.0, turns=1)
    three = [dataclasses.replace(plain, sample=i, tool_format_errors=k) for i, k in enumerate((0, 2, 1))]
    assert summarize(three, n=3)["overall"]["tool_format_errors"] == 3
