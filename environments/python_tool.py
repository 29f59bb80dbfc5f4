"""`python`: a Python tool on the code sandbox (rlfleet.sandbox: resource limits, no network, no
processes, a fresh interpreter per call).

`<tool_call>{"name": "python", "arguments": {"code": "print(2**10)"}}</tool_call>` or
`<tool name="python">print(2**10)</tool>`: the model reads what the code printed (stdout, then
stderr), cut to `max_output_chars`. Code that raises, times out or breaks a limit is a tool error
(the model sees why). A turn without a tool call is the final answer, scored by the reward service.
"""
from __future__ import annotations

from rlfleet.env.base import Environment, Step
from rlfleet.env.types import Action, EpisodeRow, Message, ToolCall, ToolSpec
from rlfleet.sandbox import SandboxLimits, run_python


def code_of(call: ToolCall) -> str:
    args = call.arguments
    return str(args.get("code", "")) if isinstance(args, dict) else str(args)


class PythonTool(Environment):
    name = "python"
    description = ("Runs Python code in a sandbox and shows its output; the turn without a tool call is the "
                   "final answer.")
    tools = (ToolSpec("python", "Runs Python code; what it prints is the result.",
                      {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}),)

    def __init__(self, max_calls: int = 4, timeout_s: float = 5.0, memory_mb: int = 512,
                 max_output_chars: int = 1000):
        self.max_calls = max_calls
        self.limits = SandboxLimits(timeout_s=timeout_s, memory_mb=memory_mb)
        self.max_output_chars = max_output_chars

    def start(self, row: EpisodeRow) -> dict:
        return {"calls": 0}

    def step(self, state: dict, action: Action) -> Step:
        if not action.tool_calls:
            return Step(done=True)
        messages, errors = [], 0
        for call in action.tool_calls:
            state["calls"] += 1
            if call.name != "python":
                content, failed = f"error: unknown tool {call.name!r} (the tool is 'python')", True
            elif state["calls"] > self.max_calls:
                content, failed = f"error: no more than {self.max_calls} python calls per problem", True
            else:
                result = run_python(code_of(call), "", self.limits)
                output = (result.stdout + (result.stderr if result.stderr else ""))[-self.max_output_chars:]
                failed = result.status != "ok"
                content = output if not failed else f"error ({result.status}): {output}".rstrip()
            errors += failed
            messages.append(Message("tool", content, name="python"))
        return Step(observation=messages, tool_errors=errors)
