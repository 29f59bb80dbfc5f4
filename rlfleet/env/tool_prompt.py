"""The environment's tools in the episode prompts (`env.tools_in_prompt`, docs/environments.md).

An environment that describes its tools (Describe) has them put into every episode prompt, so the
data set need not name them. Two ways, chosen by the model's chat template:

* **native**: a template that renders tools (it reads the `tools` variable, as Qwen2.5's,
  Llama 3.1's and Hermes' do) gets them as `apply_chat_template(..., tools=[...])`, in the
  OpenAI function format transformers passes on: `{"type": "function", "function": {"name",
  "description", "parameters"}}`. The template then words the instruction and the call format.
* **system message**: any other template gets a short system message naming each tool and the
  tagged format the agent loop parses (rlfleet/env/toolcalls.py),
  `<tool_call>{"name": …, "arguments": {…}}</tool_call>`. It goes after a system message the
  prompt already has (in the same message), else first.

A prompt that is a plain string (no messages) is used as it is: its author owns the format.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rlfleet.env.types import ToolSpec

NATIVE, SYSTEM_MESSAGE = "native", "system_message"


def openai_tools(specs: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """The tools as chat templates take them (OpenAI function specs)."""
    return [{"type": "function",
             "function": {"name": s.name, "description": s.description,
                          "parameters": s.parameters or {"type": "object", "properties": {}}}}
            for s in specs]


def tools_system_text(specs: Sequence[ToolSpec]) -> str:
    """The short system message that offers the tools to a model whose template cannot: each tool
    as `name(argument, …): description`, then one example call (short, as a small model reads it)."""
    lines = ["Tools:"]
    for s in specs:
        line = f"{s.name}({', '.join(_argument_names(s))})"
        lines.append(f"{line}: {s.description}" if s.description else line)
    example = specs[0]
    example_args = {name: "..." for name in _argument_names(example)[:1]}
    call = json.dumps({"name": example.name, "arguments": example_args}, ensure_ascii=False)
    lines.append(f"To call one, write <tool_call>{call}</tool_call> and stop; the result comes back. "
                 "A reply without a tool call is the final answer.")
    return "\n".join(lines)


def _argument_names(spec: ToolSpec) -> list[str]:
    properties = (spec.parameters or {}).get("properties")
    return list(properties) if isinstance(properties, dict) else []


def template_renders_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template reads `tools` (a named set: any of its templates)."""
    from rlfleet.models.prompt_tokenizer import template_variables

    template = getattr(tokenizer, "chat_template", None)
    sources = list(template.values()) if isinstance(template, dict) else [template]
    return any(isinstance(s, str) and "tools" in template_variables(s) for s in sources)


@dataclass(frozen=True)
class ToolPrompt:
    """How a prompt's messages get the tools: `way` is NATIVE or SYSTEM_MESSAGE."""

    specs: tuple[ToolSpec, ...]
    way: str

    @classmethod
    def for_tokenizer(cls, specs: Sequence[ToolSpec], tokenizer: Any) -> ToolPrompt:
        return cls(tuple(specs), NATIVE if template_renders_tools(tokenizer) else SYSTEM_MESSAGE)

    def render(self, messages: list[dict[str, Any]], tokenizer: Any) -> str:
        """The prompt text: `messages` through the chat template, with the tools, ready for generation."""
        if self.way == NATIVE:
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                 tools=openai_tools(self.specs))
        return tokenizer.apply_chat_template(self.with_system_message(messages), tokenize=False,
                                             add_generation_prompt=True)

    def with_system_message(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        text = tools_system_text(self.specs)
        if messages and messages[0].get("role") == "system":
            first = {**messages[0], "content": f"{messages[0]['content']}\n\n{text}"}
            return [first, *messages[1:]]
        return [{"role": "system", "content": text}, *messages]

    def summary(self) -> str:
        how = "the chat template's tools" if self.way == NATIVE else "a system message"
        return f"{', '.join(s.name for s in self.specs)} (as {how})"


def choose_tool_prompt(mode: bool | str, specs: Sequence[ToolSpec] | None, tokenizer: Any,
                       address: str) -> ToolPrompt | None:
    """env.tools_in_prompt applied to what the environment at `address` described (`specs`; None:
    no Describe): auto puts tools in when there are some, true insists on them, false never does."""
    if mode is False:
        return None
    if not specs:
        if mode is True:
            from rlfleet.errors import ConfigError

            what = "implements no Describe" if specs is None else "describes no tools"
            raise ConfigError(f"env.tools_in_prompt=true, but the environment at {address} {what}: set "
                              "env.tools_in_prompt to auto or false, or give the environment its tools")
        return None
    return ToolPrompt.for_tokenizer(specs, tokenizer)
