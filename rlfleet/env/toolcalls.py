"""Tool calls in a model's turn, in the two formats the agent loop reads.

* The chat-template format (Hermes, used by Qwen2.5's and many other chat templates that render
  tools): ``<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>``.
* A simple tagged format for models whose template has no tool calls:
  ``<tool name="calculator">2+3</tool>`` (the arguments are the raw text between the tags).

A call whose JSON cannot be read is still a call (the model tried): it keeps the raw text as
its arguments and an empty name, so the environment answers it with an error the model sees.
An opening tag that is never closed (`<tool_call>{…}</tool_calll`, a turn cut short) is no call at
all: the environment takes the turn for a final answer. `malformed_tool_calls` counts those, as
tool-format errors (`env/tool_format_errors`, `rlfleet eval`'s `tool_format_errors`).
"""
from __future__ import annotations

import json
import re

from rlfleet.env.types import ToolCall

_JSON_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_TAGGED_CALL = re.compile(r"<tool\s+name\s*=\s*[\"']?([\w.-]+)[\"']?\s*>(.*?)</tool>", re.DOTALL)
_JSON_OPEN = re.compile(r"<tool_call>")
_TAGGED_OPEN = re.compile(r"<tool\s+name\s*=\s*[\"']?[\w.-]+[\"']?\s*>")


def parse_tool_calls(text: str) -> tuple[ToolCall, ...]:
    """Every tool call in `text`, in the order they appear."""
    found: list[tuple[int, ToolCall]] = []
    for match in _JSON_CALL.finditer(text):
        found.append((match.start(), _json_call(match.group(1))))
    for match in _TAGGED_CALL.finditer(text):
        found.append((match.start(), ToolCall(name=match.group(1), arguments=match.group(2).strip())))
    return tuple(call for _, call in sorted(found, key=lambda pair: pair[0]))


def malformed_tool_calls(text: str) -> int:
    """Tool-call openings in `text` that do not make a call (no closing tag after them)."""
    return (len(_JSON_OPEN.findall(text)) - len(_JSON_CALL.findall(text))
            + len(_TAGGED_OPEN.findall(text)) - len(_TAGGED_CALL.findall(text)))


def _json_call(body: str) -> ToolCall:
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        return ToolCall(name="", arguments=body)
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return ToolCall(name="", arguments=body)
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):  # some templates put the arguments in as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    return ToolCall(name=value["name"], arguments=arguments)


def arguments_to_json(call: ToolCall) -> str:
    return json.dumps(call.arguments)


def arguments_from_json(text: str) -> object:
    return json.loads(text) if text else ""
