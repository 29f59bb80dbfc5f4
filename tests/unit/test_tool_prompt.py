"""The environment's tools in the episode prompts (rlfleet/env/tool_prompt.py): rendered with the tiny
model's template (no tools: a system message) and with a template that renders tools (natively),
the expected prompts written out by hand."""
from __future__ import annotations

import pytest

from rlfleet.data.prompts import render_prompt
from rlfleet.env.tool_prompt import (NATIVE, SYSTEM_MESSAGE, ToolPrompt, choose_tool_prompt, openai_tools,
                                     template_renders_tools)
from rlfleet.env.types import ToolSpec
from rlfleet.errors import ConfigError, InvalidRequest
from rlfleet.models.prompt_tokenizer import PromptTokenizer, read_prompt_tokenizer
from rlfleet.models.resolve import BUILTIN_MODEL, resolve_model_path
from rlfleet.proto.v1 import environment_pb2 as pb
from rlfleet.rpc.env_convert import tools_from_proto, tools_to_proto

pytestmark = pytest.mark.unit

CALC = ToolSpec("calculator", "Evaluates an arithmetic expression.",
                {"type": "object", "properties": {"expression": {"type": "string"}},
                 "required": ["expression"]})
ASK = [{"role": "user", "content": "What is 6 * 7?"}]

# A template that renders tools, in the manner of Qwen2.5's (much shortened): the tools as JSON lines
# in a system message of their own, then the conversation in ChatML.
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n# Tools\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def tiny_dir():
    return resolve_model_path(BUILTIN_MODEL)


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return read_prompt_tokenizer(tiny_dir)


@pytest.fixture(scope="module")
def with_tools(tiny_dir):
    return PromptTokenizer(tiny_dir / "tokenizer.json", TOOLS_TEMPLATE, {"eos_token": "<|im_end|>"})


def test_a_template_without_tools_gets_a_system_message_naming_the_tagged_format(tiny):
    tool_prompt = ToolPrompt.for_tokenizer([CALC], tiny)
    assert tool_prompt.way == SYSTEM_MESSAGE
    assert render_prompt(ASK, tiny, tool_prompt) == (
        "<|im_start|>system\n"
        "Tools:\n"
        "calculator(expression): Evaluates an arithmetic expression.\n"
        'To call one, write <tool_call>{"name": "calculator", "arguments": {"expression": "..."}}'
        "</tool_call> "
        "and stop; the result comes back. A reply without a tool call is the final answer.<|im_end|>\n"
        "<|im_start|>user\nWhat is 6 * 7?<|im_end|>\n"
        "<|im_start|>assistant\n")


def test_the_system_message_joins_the_prompts_own_system_message(tiny):
    tool_prompt = ToolPrompt.for_tokenizer([ToolSpec("clock")], tiny)  # no description, no arguments
    messages = [{"role": "system", "content": "Be brief."}, *ASK]
    assert render_prompt(messages, tiny, tool_prompt) == (
        "<|im_start|>system\nBe brief.\n\n"
        "Tools:\n"
        "clock()\n"
        'To call one, write <tool_call>{"name": "clock", "arguments": {}}</tool_call> '
        "and stop; the result comes back. A reply without a tool call is the final answer.<|im_end|>\n"
        "<|im_start|>user\nWhat is 6 * 7?<|im_end|>\n"
        "<|im_start|>assistant\n")
    assert messages[0]["content"] == "Be brief."  # the row's messages are left as they were


def test_a_template_that_renders_tools_gets_them_as_openai_function_specs(with_tools):
    tool_prompt = ToolPrompt.for_tokenizer([CALC], with_tools)
    assert tool_prompt.way == NATIVE
    assert render_prompt(ASK, with_tools, tool_prompt) == (
        "<|im_start|>system\n# Tools\n"
        '{"type": "function", "function": {"name": "calculator", "description": "Evaluates an arithmetic '
        'expression.", "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, '
        '"required": ["expression"]}}}\n'
        "<|im_end|>\n"
        "<|im_start|>user\nWhat is 6 * 7?<|im_end|>\n"
        "<|im_start|>assistant\n")


def test_without_tools_the_prompts_are_unchanged(tiny, with_tools):
    plain = "<|im_start|>user\nWhat is 6 * 7?<|im_end|>\n<|im_start|>assistant\n"
    assert render_prompt(ASK, tiny, None) == plain
    assert render_prompt(ASK, with_tools, None) == render_prompt(ASK, tiny, None)
    assert render_prompt("plain text", tiny, ToolPrompt.for_tokenizer([CALC], tiny)) == "plain text"


def test_the_torch_free_tokenizer_renders_tools_as_transformers_does(tiny_dir, with_tools):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(tiny_dir)
    hf.chat_template = TOOLS_TEMPLATE
    tools = openai_tools([CALC, ToolSpec("clock")])
    assert hf.apply_chat_template(ASK, tokenize=False, add_generation_prompt=True, tools=tools) == \
        with_tools.apply_chat_template(ASK, add_generation_prompt=True, tools=tools)
    assert ToolPrompt.for_tokenizer([CALC], hf).way == NATIVE


def test_template_support_is_read_from_the_variables_it_uses(tiny, with_tools):
    assert not template_renders_tools(tiny) and template_renders_tools(with_tools)

    class Named:  # a set of named templates, as some models ship: any that reads tools
        chat_template = {"default": "{{ messages }}", "tool_use": "{{ tools }}{{ messages }}"}

    class Mention:  # the word in a string literal is no use of the variable
        chat_template = "{{ 'tools' }}{{ messages }}"

    assert template_renders_tools(Named()) and not template_renders_tools(Mention())


def test_the_config_modes(tiny):
    assert choose_tool_prompt(False, [CALC], tiny, "h:1") is None
    assert choose_tool_prompt("auto", None, tiny, "h:1") is None  # no Describe
    assert choose_tool_prompt("auto", [], tiny, "h:1") is None
    assert choose_tool_prompt("auto", [CALC], tiny, "h:1") == ToolPrompt((CALC,), SYSTEM_MESSAGE)
    assert choose_tool_prompt(True, [CALC], tiny, "h:1") == ToolPrompt((CALC,), SYSTEM_MESSAGE)
    with pytest.raises(ConfigError, match=r"env.tools_in_prompt=true.*h:1 implements no Describe"):
        choose_tool_prompt(True, None, tiny, "h:1")
    with pytest.raises(ConfigError, match="describes no tools"):
        choose_tool_prompt(True, [], tiny, "h:1")


def test_described_tools_round_trip_and_a_bad_schema_names_the_tool():
    assert tools_from_proto(tools_to_proto((CALC, ToolSpec("clock"))), "h:1") == (CALC, ToolSpec("clock"))
    with pytest.raises(InvalidRequest, match="environment h:1: tool 'calc' parameters_json is not JSON"):
        tools_from_proto([pb.ToolSpec(name="calc", parameters_json="{oops")], "h:1")
