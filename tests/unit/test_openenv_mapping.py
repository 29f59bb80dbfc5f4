"""The OpenEnv mapping (rlfleet/env/openenv.py), pure: which schemas are text actions, typed tools or MCP,
how a turn becomes an action, what the model is shown, and the episode reward under env.reward."""
from __future__ import annotations

import pytest

from rlfleet.env.openenv import (MCP, TEXT, TYPED, BadReply, RewardTally, action_spec, build_action,
                                 mcp_result_text, observation_text, parse_answer)
from rlfleet.env.types import Action, ToolCall, ToolSpec

pytestmark = pytest.mark.unit
META = {"metadata": {"type": "object"}}  # OpenEnv's Action base field, never filled


def schema(properties: dict, required=(), title="A") -> dict:
    return {"title": title, "type": "object", "properties": {**META, **properties},
            "required": list(required)}


@pytest.mark.parametrize("s, mode, field", [
    (schema({"message": {"type": "string"}}, ["message"]), TEXT, "message"),  # OpenEnv's echo style
    (schema({"text": {"type": "string"}}), TEXT, "text"),                          # the only field, optional
    (schema({"cmd": {"type": "string"}, "t": {"type": "number"}}, ["cmd"]), TEXT, "cmd"),  # one required
    (schema({"x": {"type": "integer"}}, ["x"]), TYPED, ""),                        # not a string
    (schema({"a": {"type": "string"}, "b": {"type": "string"}}, ["a", "b"]), TYPED, ""),   # two to fill
    (schema({"a": {"type": "string"}, "b": {"type": "string"}}), TYPED, ""),       # two optional: which?
])
def test_which_schemas_are_text_actions(s, mode, field):
    spec = action_spec(s)
    assert (spec.mode, spec.text_field) == (mode, field)
    if mode == TYPED:
        (tool,) = spec.tools
        assert tool.name == "A" and "metadata" not in tool.parameters["properties"]


def test_mcp_and_unusable_schemas():
    mcp = schema({"type": {"const": "call_tool"}, "tool_name": {"type": "string"},
                  "arguments": {"type": "object"}}, ["tool_name"])
    assert action_spec(mcp, (ToolSpec("add"),)).mode == MCP
    with pytest.raises(BadReply, match="lists no tools"):
        action_spec(mcp)
    with pytest.raises(BadReply, match="no field"):
        action_spec(schema({}))


def test_a_turn_becomes_an_action_or_a_tool_error():
    text = action_spec(schema({"message": {"type": "string"}}, ["message"]))
    assert build_action(text, Action("e", " 42\n")).action == {"message": " 42\n"}  # as it is
    typed = action_spec(schema({"x": {"type": "integer"}}, ["x"], title="Move"))
    assert build_action(typed, Action("e", "", (ToolCall("Move", {"x": 3}),))).action == {"x": 3}
    assert build_action(typed, Action("e", "", (ToolCall("Move", '{"x": 4}'),))).action == {"x": 4}
    assert "not a JSON object" in build_action(typed, Action("e", "", (ToolCall("Move", "x=4"),))).error
    assert "call one of Move" in build_action(typed, Action("e", "no call")).error
    mcp = action_spec(schema({"tool_name": {"type": "string"}, "arguments": {"type": "object"}}),
                      (ToolSpec("add"),))
    assert build_action(mcp, Action("e", "", (ToolCall("add", {"a": 1}),))).action == \
        {"type": "call_tool", "tool_name": "add", "arguments": {"a": 1}}


def test_what_the_model_is_shown():
    assert observation_text({"feedback": "Try again."}) == "Try again."
    assert observation_text({"feedback": "", "echo": None}) == ""
    assert observation_text({"hint": "higher", "guesses": 0}) == '{"guesses": 0, "hint": "higher"}'
    content = {"content": [{"type": "text", "text": "5.0"}], "data": 5.0}
    assert mcp_result_text({"result": content}) == ("5.0", False)
    assert mcp_result_text({"result": {"data": 7}}) == ("7", False)
    assert mcp_result_text({"error": {"message": "bad b"}}) == ("error: bad b", True)


def test_replies_that_break_the_format():
    good = {"type": "observation", "data": {"observation": {"f": "x"}, "reward": 1, "done": True}}
    answer = parse_answer(good, "user")
    assert (answer.reward, answer.done, answer.observation.messages[0].content) == (1.0, True, "x")
    for data, words in [({"observation": []}, "expected"), ({"observation": {}, "reward": "1"}, "reward"),
                        ({"observation": {}, "reward": float("inf")}, "non-finite"),
                        ({"observation": {}, "done": 1}, "done")]:
        with pytest.raises(BadReply, match=words):
            parse_answer({"type": "observation", "data": data}, "user")


def test_episode_reward_sum_last_service():
    # steps give 0.0, nothing, -0.25, 1.0: sum 0.75, last 1.0, service none (the reward service scores)
    for mode, expected in (("sum", 0.75), ("last", 1.0), ("service", None)):
        tally = RewardTally(mode)
        values = [tally.add(r) for r in (0.0, None, -0.25, 1.0)]
        assert values[-1] == expected
    assert [RewardTally("sum").add(None)] == [None]  # no reward given yet: none
    with pytest.raises(ValueError, match="env.reward"):
        RewardTally("mean")
