"""Tool-use traces: conversations in which a scripted teacher works a task with an environment's tool.

For the arithmetic task (rlfleet/data/arithmetic.py, both levels) the teacher follows the row's
worked answer, one line `a op b = c` per operation: it calls the calculator with `a op b` (from the
second line on, `a` is the result the environment gave for the previous call, never the precomputed
one), reads the result, and after the last call answers in GSM8K's form with the results it was
given (`12 * 34 = 408` … `#### 413`). Its turns are written in the call format of the tools' system
message (rlfleet/data/conversation.py renders them back into exactly that text).

A trace row is an OpenAI conversation plus the tools offered (TRL's `messages` + `tools`, verl's
multi-turn SFT columns) and the row's verl fields, so the same file can be looked at and scored:

    messages      [{role: user, content}, {role: assistant, content: "", tool_calls: [...]},
                   {role: tool, content: "408", name: calculator, tool_call_id}, ..., {role: assistant, ...}]
    tools         the environment's tools as OpenAI function specs, JSON text ('' when left out)
    data_source, reward_model, extra_info   the task row's (extra_info.tool_calls: the calls made)

The module is pure: the environment is played by rlfleet/app/traces_command.py.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from rlfleet.data.conversation import call_text
from rlfleet.env.types import Message
from rlfleet.errors import DataError

_STEP = re.compile(r"^\s*(-?\d+)\s*([-+*/])\s*(-?\d+)\s*=\s*(-?[\d.]+)\s*$")


@dataclass
class Teacher:
    """One episode's scripted turns: the calls of a worked answer, then the answer from the results."""

    steps: list[tuple[str, str, str]]  # (left, symbol, right) of each line of the worked answer
    tool: str = "calculator"
    results: list[str] = field(default_factory=list)

    @classmethod
    def for_row(cls, row: dict[str, Any], tool: str = "calculator") -> Teacher:
        info = row.get("extra_info") or {}
        answer = info.get("answer") if isinstance(info, dict) else None
        if not isinstance(answer, str):
            raise DataError("the task row has no worked answer (extra_info.answer) to follow")
        steps = []
        for line in answer.splitlines():
            match = _STEP.match(line)
            if match:
                steps.append((match.group(1), match.group(2), match.group(3)))
        if not steps:
            raise DataError(f"the worked answer has no 'a op b = c' line to make a call of: {answer[:80]!r}")
        return cls(steps, tool)

    @property
    def calls_left(self) -> bool:
        return len(self.results) < len(self.steps)

    def expression(self) -> str:
        left, symbol, right = self.steps[len(self.results)]
        if self.results:
            left = self.results[-1]
        return f"{left} {symbol} {right}"

    def call_message(self, call_id: str) -> dict[str, Any]:
        """The assistant's next call, as an OpenAI message."""
        arguments = json.dumps({"expression": self.expression()})
        return {"role": "assistant", "content": "",
                "tool_calls": [{"id": call_id, "type": "function",
                                "function": {"name": self.tool, "arguments": arguments}}]}

    def call_turn_text(self) -> str:
        """What the model writes for that call (rlfleet/data/conversation.py renders the same)."""
        return call_text(self.tool, {"expression": self.expression()})

    def take_result(self, messages: tuple[Message, ...]) -> None:
        self.results.append(messages[0].content.strip() if messages else "")

    def answer(self) -> str:
        lines, left = [], None
        for (first, symbol, right), result in zip(self.steps, self.results):
            lines.append(f"{first if left is None else left} {symbol} {right} = {result}")
            left = result
        return "\n".join([*lines, f"#### {left}"])


def tool_message(message: Message, call_id: str) -> dict[str, Any]:
    return {"role": message.role, "content": message.content, "name": message.name or None,
            "tool_call_id": call_id if message.role == "tool" else None}


def trace_row(task_row: dict[str, Any], messages: list[dict[str, Any]], tools_json: str,
              calls: int) -> dict[str, Any]:
    info = dict(task_row.get("extra_info") or {})
    info["tool_calls"] = calls
    return {"messages": messages, "tools": tools_json, "data_source": task_row["data_source"],
            "reward_model": task_row["reward_model"], "extra_info": info}
