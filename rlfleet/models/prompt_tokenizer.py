"""The controller's tokenizer: renders prompts with the chat template and counts their tokens, without torch.

`transformers.AutoTokenizer` imports torch (through its generation utilities): ~250 MB and a
second or more of start-up in a process that only renders and measures prompts. A model folder
with a `tokenizer.json` holds everything that needs: the `tokenizers` library encodes with it,
and transformers' own template renderer (`render_jinja_template`, importable without torch)
renders the chat template with the special tokens as variables, as `apply_chat_template` does.
A folder this cannot read (no tokenizer.json, several named templates) gets AutoTokenizer.

Only the calls the prompt loaders make are offered: `chat_template`,
`apply_chat_template(messages, tokenize=False, add_generation_prompt=True)` and
`tokenizer(text, add_special_tokens=False)["input_ids"]`.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class PromptTokenizer:
    def __init__(self, tokenizer_file: Path, chat_template: str | None, special_tokens: dict[str, str]):
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(tokenizer_file))
        self.chat_template = chat_template
        self.special_tokens = special_tokens

    def apply_chat_template(self, messages: list[dict[str, Any]], tokenize: bool = False,
                            add_generation_prompt: bool = False) -> str:
        if tokenize:
            raise ValueError("PromptTokenizer renders text only (tokenize=False)")
        from transformers.utils.chat_template_utils import render_jinja_template

        rendered, _ = render_jinja_template(conversations=[messages], chat_template=self.chat_template,
                                            add_generation_prompt=add_generation_prompt, **self.special_tokens)
        return rendered[0]

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids}


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
