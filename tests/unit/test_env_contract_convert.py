"""The environment contract's decided points on the server side of the conversion (issue 32)."""
from __future__ import annotations

import pytest

from rlfleet.errors import InvalidRequest
from rlfleet.proto.v1 import environment_pb2 as pb
from rlfleet.rpc.env_convert import actions_from_proto
from rlfleet.types import Completion
from controller.groups import context_prompt

pytestmark = pytest.mark.unit


def test_an_empty_arguments_json_is_a_call_without_arguments():
    request = pb.StepRequest(actions=[pb.Action(episode_id="e", text="t", turn=1, tool_calls=[
        pb.ToolCall(name="clock", arguments_json=""), pb.ToolCall(name="calc", arguments_json='"6*7"')])])
    [action] = actions_from_proto(request)
    assert [(c.name, c.arguments) for c in action.tool_calls] == [("clock", {}), ("calc", "6*7")]
    with pytest.raises(InvalidRequest, match="arguments_json is not JSON"):
        actions_from_proto(pb.StepRequest(actions=[pb.Action(episode_id="e", tool_calls=[
            pb.ToolCall(name="calc", arguments_json="{oops")])]))


def test_the_trained_context_drops_the_prompt_tokens_an_opening_replaced():
    prompt = [5, 6, 7, 8, 9]  # ... 8 9: the generation prompt
    plain = Completion(token_ids=[1], logprobs=[0.0], finish_reason="stop", policy_version=0)
    opened = Completion(token_ids=[1], logprobs=[0.0], finish_reason="stop", policy_version=0, prompt_trim=2)
    assert context_prompt(prompt, plain) == prompt and context_prompt(prompt, opened) == [5, 6, 7]
