"""Multi-turn SFT examples: a conversation rendered token by token as the agent loop renders an episode.

A conversation is a list of OpenAI chat messages: `system`/`user` messages, `assistant` messages (with
`content` and optionally `tool_calls`: `[{"type": "function", "function": {"name", "arguments"}}]`,
the arguments a dict or JSON text), and the `tool` (or `user`) messages that answer them, plus
optionally the tools offered (`tools`: OpenAI function specs, TRL's and verl's column). That is what
`rlfleet data traces` writes and what verl's multi-turn SFT and TRL's messages+tools data sets hold.

The tokens are the agent loop's (services/rollout/agent_loop.py), through the same code:

    prompt    the messages before the first assistant turn, by `render_prompt` with the tools
              (rlfleet/env/tool_prompt.py: the template's own tools, or the tools' system message)
    turn      an assistant message as the model writes it (below), then the end-of-turn token:
              mask 1, the loss is taken here
    answer    the messages up to the next assistant turn, as an observation after a turn that ended
              with its end-of-turn token (rlfleet/env/chat.py): mask 0, context only

An assistant message's text is its content, then each tool call in the format the model is told to
write: `<tool_call>{"name": …, "arguments": {…}}</tool_call>` (the tools' system message), or, with a
chat template that renders tool calls itself, what that template writes for the message. The
end-of-turn token after a call is trained on too: with `rollout.stop` at `</tool_call>` the rollout
stops there and shows the same token as the observation's first (the tokens are the same, only that
one token's mask differs); without the stop the model has learned to end its turn after a call.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rlfleet.data.prompts import render_prompt
from rlfleet.env.chat import ObservationRenderer
from rlfleet.env.tool_prompt import NATIVE, ToolPrompt
from rlfleet.env.types import Message, Observation, ToolSpec
from rlfleet.errors import DataError

ASSISTANT = "assistant"


@dataclass(frozen=True)
class RenderedConversation:
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]  # per response token: 1 the model's own (trained on), 0 shown to it


def tool_specs(raw: Any) -> tuple[ToolSpec, ...]:
    """The tools of a `tools` column: None, a JSON text, or a list of OpenAI function specs
    (`{"type": "function", "function": {...}}`) or bare `{"name", "description", "parameters"}`."""
    if raw is None or raw == "":
        return ()
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise DataError(f"'tools' is text but not JSON: {exc.msg}") from None
    if not isinstance(raw, (list, tuple)):
        raise DataError(f"'tools' must be a list of function specs, not {type(raw).__name__}")
    specs = []
    for k, item in enumerate(raw):
        spec = item.get("function", item) if isinstance(item, dict) else None
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise DataError(f"'tools' entry {k} has no function name: {str(item)[:80]}")
        parameters = spec.get("parameters") or {}
        if isinstance(parameters, str):
            parameters = json.loads(parameters)
        specs.append(ToolSpec(spec["name"], spec.get("description") or "", parameters))
    return tuple(specs)


def _call_parts(call: Any, where: str) -> tuple[str, Any]:
    function = call.get("function", call) if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise DataError(f"{where}: a tool call without a function name: {str(call)[:80]}")
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):  # OpenAI's own form: the arguments as JSON text
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            raise DataError(f"{where}: tool call arguments are not JSON: {arguments[:80]!r}") from None
    return function["name"], arguments


def call_text(name: str, arguments: Any) -> str:
    """One call in the tagged format of the tools' system message (parsed by rlfleet/env/toolcalls.py)."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}</tool_call>"


class ConversationRenderer:
    """Renders conversations for one tokenizer; `eos_ids`: the tokens that end a generated turn."""

    def __init__(self, tokenizer: Any, eos_ids: list[int]):
        self.tokenizer = tokenizer
        self.observations = ObservationRenderer(tokenizer)
        eos_token_id = tokenizer.convert_tokens_to_ids(tokenizer.eos_token) if tokenizer.eos_token else None
        self.end_of_turn = eos_token_id if eos_token_id in eos_ids else eos_ids[0]

    def render(self, messages: Any, tools: Any = None, where: str = "conversation") -> RenderedConversation:
        if not isinstance(messages, (list, tuple)) or not all(isinstance(m, dict) for m in messages):
            raise DataError(f"{where}: 'messages' must be a list of chat messages, not "
                            f"{type(messages).__name__}")
        roles = [m.get("role") for m in messages]
        if ASSISTANT not in roles:
            raise DataError(f"{where}: no assistant message: nothing to train on")
        if roles[-1] != ASSISTANT:
            raise DataError(f"{where}: the last message is a {roles[-1]!r} message; a conversation to train "
                            "on ends with the assistant's turn")
        specs = tool_specs(tools)
        tool_prompt = ToolPrompt.for_tokenizer(specs, self.tokenizer) if specs else None
        first = roles.index(ASSISTANT)
        prefix = [{"role": m.get("role", "user"), "content": _content(m, where)} for m in messages[:first]]
        if not prefix:
            raise DataError(f"{where}: the conversation starts with the assistant; it needs a prompt")
        prompt_ids = self.observations.ids(render_prompt(prefix, self.tokenizer, tool_prompt))
        ids: list[int] = []
        mask: list[int] = []
        shown: list[Message] = []
        for m in messages[first:]:
            if m.get("role") != ASSISTANT:
                shown.append(Message(str(m.get("role")), _content(m, where), str(m.get("name") or "")))
                continue
            if shown:  # what answered the previous turn, as the agent loop appends it
                text = self.observations.text(Observation(messages=tuple(shown)), turn_ended_with_eos=True)
                observed = self.observations.ids(text)
                ids += observed
                mask += [0] * len(observed)
                shown = []
            turn = [*self.observations.ids(self.assistant_text(m, tool_prompt, where)), self.end_of_turn]
            ids += turn
            mask += [1] * len(turn)
        return RenderedConversation(list(prompt_ids), ids, mask)

    def assistant_text(self, message: dict, tool_prompt: ToolPrompt | None, where: str) -> str:
        """What the model writes for this assistant message, without the end-of-turn token."""
        content = _content(message, where)
        calls = [_call_parts(c, where) for c in message.get("tool_calls") or []]
        if not calls:
            return content
        if tool_prompt is not None and tool_prompt.way == NATIVE:
            return self._template_turn(message, calls, tool_prompt, where)
        return "\n".join([*([content] if content else []), *(call_text(n, a) for n, a in calls)])

    def _template_turn(self, message: dict, calls: list[tuple[str, Any]], tool_prompt: ToolPrompt,
                       where: str) -> str:
        """The template's own text for a turn with tool calls, found by difference (rlfleet/env/chat.py)."""
        from rlfleet.env.tool_prompt import openai_tools

        tool_calls = [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]
        turn = {"role": ASSISTANT, "content": _content(message, where), "tool_calls": tool_calls}
        base = [{"role": "user", "content": "x"}]
        tools = openai_tools(tool_prompt.specs)
        before = self.tokenizer.apply_chat_template(base, tokenize=False, add_generation_prompt=True,
                                                    tools=tools)
        after = self.tokenizer.apply_chat_template([*base, turn], tokenize=False, tools=tools)
        if not after.startswith(before):
            raise DataError(f"{where}: the chat template renders the conversation differently once an "
                            "assistant turn follows it; its tool-call turn cannot be found by difference")
        text = after[len(before):]
        closing = self.observations.closing(turn_ended_with_eos=False)
        if closing and text.endswith(closing):
            text = text[:-len(closing)]
        eos = self.tokenizer.eos_token or ""
        return text[:-len(eos)] if eos and text.endswith(eos) else text


def _content(message: dict, where: str) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if not isinstance(content, str):
        raise DataError(f"{where}: a {message.get('role')!r} message has content of type "
                        f"{type(content).__name__}; it must be text")
    return content
