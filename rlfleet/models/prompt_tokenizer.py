"""The controller's tokenizer: renders prompts with the chat template and counts their tokens, without torch.

`transformers.AutoTokenizer` imports torch (through its generation utilities): ~250 MB and a
second or more of start-up in a process that only renders and measures prompts (even importing
transformers' template helper alone costs a second: the package indexes itself on import). A
model folder with a `tokenizer.json` holds everything needed: the `tokenizers` library encodes
with it, and jinja2 renders the chat template in the environment `apply_chat_template` uses
(sandboxed, trim_blocks and lstrip_blocks, loop controls, a `tojson` that does not escape HTML,
`raise_exception`, `strftime_now`, `{% generation %}` blocks rendered as their body), with
`messages`, `add_generation_prompt` and the special tokens (`bos_token`, `eos_token`, …) as
variables. tests/unit/test_lean_controller_math.py compares both on the built-in model.
A folder this cannot read (no tokenizer.json, several named templates) gets AutoTokenizer.

Only the calls the prompt loaders make are offered: `chat_template`,
`apply_chat_template(messages, tokenize=False, add_generation_prompt=True, tools=None)` and
`tokenizer(text, add_special_tokens=False)["input_ids"]`.
"""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any


class PromptTokenizer:
    def __init__(self, tokenizer_file: Path, chat_template: str | None, special_tokens: dict[str, str]):
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(tokenizer_file))
        self.chat_template = chat_template
        self.special_tokens = special_tokens
        self._template = None  # compiled on first use

    def apply_chat_template(self, messages: list[dict[str, Any]], tokenize: bool = False,
                            add_generation_prompt: bool = False,
                            tools: list[dict[str, Any]] | None = None) -> str:
        if tokenize:
            raise ValueError("PromptTokenizer renders text only (tokenize=False)")
        if self._template is None:
            self._template = compile_chat_template(self.chat_template)
        return self._template.render(messages=messages, tools=tools, documents=None,
                                     add_generation_prompt=add_generation_prompt, **self.special_tokens)

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids}


def compile_chat_template(source: str):
    """A chat template compiled in the environment transformers renders chat templates in."""
    return chat_template_environment().from_string(source)


def template_variables(source: str) -> set[str]:
    """The variables a chat template reads from its caller (`messages`, `tools`, …)."""
    from jinja2 import meta

    return meta.find_undeclared_variables(chat_template_environment().parse(source))


def chat_template_environment():
    """The jinja2 environment transformers renders chat templates in."""
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(Extension):
        """`{% generation %}…{% endgeneration %}` marks the assistant's tokens for training masks;
        rendering a prompt only needs its body."""
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body).set_lineno(lineno)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def _special_tokens(config: dict[str, Any]) -> dict[str, str]:
    """`bos_token`, `eos_token`, … as the strings a template sees (a token may be saved as {content: …})."""
    out = {}
    for key, value in config.items():
        if key.endswith("_token") and isinstance(value, dict):
            value = value.get("content")
        if key.endswith("_token") and isinstance(value, str):
            out[key] = value
    return out


def read_prompt_tokenizer(model_dir: Path) -> PromptTokenizer | None:
    """The torch-free tokenizer of `model_dir`, or None where its files need transformers' loader."""
    model_dir = Path(model_dir)
    tokenizer_file = model_dir / "tokenizer.json"
    try:
        config = json.loads((model_dir / "tokenizer_config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if not tokenizer_file.is_file() or not isinstance(config, dict):
        return None
    template = config.get("chat_template")
    jinja_file = model_dir / "chat_template.jinja"
    if template is None and jinja_file.is_file():
        template = jinja_file.read_text()
    if template is not None and not isinstance(template, str):  # named templates: transformers picks
        return None
    return PromptTokenizer(tokenizer_file, template, _special_tokens(config))


def load_prompt_tokenizer(model_dir: Path):
    """A tokenizer for rendering and measuring prompts: the torch-free one where it can be read."""
    light = read_prompt_tokenizer(model_dir)
    if light is not None:
        return light
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)
