"""Built-in environments and tool-call parsing, called directly (no server)."""
from __future__ import annotations

import pytest

from environments.calculator import Calculator, CalculatorError, evaluate
from environments.digits_game import DigitsGame, digit_credit
from environments.registry import load_environment
from rlfleet.env.toolcalls import parse_tool_calls
from rlfleet.env.types import Action, EpisodeRow, Message, Observation, ToolCall
from rlfleet.errors import ConfigError

pytestmark = pytest.mark.unit


def test_json_and_tagged_tool_calls_in_order():
    text = ('First <tool name="calculator">2 + 3</tool> then '
            '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call> and '
            '<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"print(1)\\"}"}</tool_call>')
    assert parse_tool_calls(text) == (ToolCall("calculator", "2 + 3"),
                                      ToolCall("calculator", {"expression": "6*7"}),
                                      ToolCall("python", {"code": "print(1)"}))


def test_unreadable_json_call_is_still_a_call_without_a_name():
    assert parse_tool_calls("<tool_call>{oops</tool_call>") == (ToolCall("", "{oops"),)
    assert parse_tool_calls("no calls here, <tool> without a name</tool>") == ()


def test_calculator_evaluates_arithmetic_only():
    assert evaluate("12 * (3 + 4)") == 84
    assert evaluate("7 / 2") == 3.5
    assert evaluate("2^10") == 1024
    assert evaluate("1,000 + 1") == 1001
    for bad, why in (("__import__('os')", "unsupported"), ("1/0", "division by zero"), ("9**99", "power"),
                     ("2 +", "not an arithmetic")):
        with pytest.raises(CalculatorError, match=why):
            evaluate(bad)


def test_calculator_turns_calls_into_tool_messages_and_counts_errors():
    env = Calculator(max_calls=2)
    state = env.start(EpisodeRow("e1"))
    step = env.step(state, Action("e1", "", (ToolCall("calculator", {"expression": "6*7"}),
                                             ToolCall("calculator", "1/0"))))
    assert not step.done and step.tool_errors == 1
    assert [m.content for m in Observation.of(step.observation).messages] == ["42", "error: division by zero"]
    third = env.step(state, Action("e1", "", (ToolCall("calculator", "1+1"),)))
    assert third.tool_errors == 1 and "no more than 2" in third.observation[0].content
    final = env.step(state, Action("e1", "The answer is #### 42"))
    assert final.done and final.reward is None  # the reward service scores the final answer


def test_digits_game_rewards_early_right_answers():
    # credit = right positions / the longer length; each try after the first costs 0.25.
    assert digit_credit("1274", "1274") == 1.0
    assert digit_credit("1204", "1274") == 0.75
    assert digit_credit("12", "1274") == 0.5
    env = DigitsGame(max_tries=3)
    state = env.start(EpisodeRow("e", ground_truth="1274"))
    first = env.step(state, Action("e", "1204"))
    assert not first.done and first.reward is None
    assert first.observation == [Message("user", "Reverse the digits: 4721")]
    second = env.step(state, Action("e", "1274"))
    assert second.done and second.reward == pytest.approx(1.0 - 0.25)
    state = env.start(EpisodeRow("f", ground_truth="1274"))
    for text in ("0000", "0000"):
        env.step(state, Action("f", text))
    last = env.step(state, Action("f", "1270"))  # third and last try: 0.75 credit - 2 * 0.25
    assert last.done and last.reward == pytest.approx(0.25)


def test_registry_names_what_is_wrong():
    assert load_environment("digits_game", {"max_tries": 2}).max_tries == 2
    with pytest.raises(ConfigError, match="neither a built-in"):
        load_environment("nope")
    with pytest.raises(ConfigError, match=r"neither a built-in .* \(did you mean 'calculator'\?\)$"):
        load_environment("calculater")
    with pytest.raises(ConfigError, match=r"neither a built-in .* \(did you mean 'digits_game'\?\)$"):
        load_environment("digits-game")
    with pytest.raises(ConfigError, match="cannot import"):
        load_environment("no_such_module:Env")
    with pytest.raises(ConfigError, match="bad parameters"):
        load_environment("calculator", {"colour": "red"})
