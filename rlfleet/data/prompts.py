"""Prompts from Parquet files in the verl schema, tokenized and length-filtered.

Columns: `data_source`, `prompt` (a chat message list, or a plain string),
`reward_model` ({style, ground_truth}), optional `extra_info`. A missing column
is an error naming the file and the columns it does have; prompts longer than
`max_prompt_length` are filtered out and counted, never truncated.
"""
from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import structlog

from rlfleet.env.tool_prompt import ToolPrompt
from rlfleet.errors import DataError

log = structlog.get_logger(__name__)

REQUIRED = ("data_source", "reward_model")


@dataclass(frozen=True)
class Prompt:
    index: int  # row in the data set (rows of the files in order), whatever was left out before it
    text: str  # the prompt as the model sees it (chat template applied)
    prompt_ids: list[int]
    data_source: str
    ground_truth: str
    extra_info: dict[str, Any] = field(default_factory=dict)


def _read_table(path: Path, prompt_key: str) -> list[dict[str, Any]]:
    if not path.is_file():
        raise DataError(f"data file {path} does not exist")
    try:
        # ParquetFile, not pq.read_table: read_table goes through pyarrow.dataset, which imports pandas
        # (~45 MB in the controller's process) even for a file without pandas metadata.
        table = pq.ParquetFile(path).read()
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a bad file
        raise DataError(f"data file {path} is not readable Parquet: {exc}") from None
    missing = [c for c in (prompt_key, *REQUIRED) if c not in table.column_names]
    if missing:
        raise DataError(f"data file {path} has no column {', '.join(repr(c) for c in missing)}; "
                        f"its columns are: {', '.join(table.column_names)}")
    return table.to_pylist()


def render_prompt(raw: Any, tokenizer: Any, tools: ToolPrompt | None = None) -> str:
    """A message list goes through the tokenizer's chat template (with the environment's `tools`,
    rlfleet/env/tool_prompt.py); a string is used as is."""
    if isinstance(raw, str):
        return raw
    if isinstance(raw, (list, tuple)) and all(isinstance(m, dict) and "content" in m for m in raw):
        for j, m in enumerate(raw):  # a template would render a number or a parts list as its repr, or crash
            if not isinstance(m["content"], str):
                raise DataError(f"chat message {j} has content of type {type(m['content']).__name__}; "
                                "the content of every chat message must be a string")
        messages = [{"role": m.get("role", "user"), "content": m["content"]} for m in raw]
        if tools is not None and tools.specs:
            if getattr(tokenizer, "chat_template", None):
                return tools.render(messages, tokenizer)
            messages = tools.with_system_message(messages)
        if getattr(tokenizer, "chat_template", None):
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return "\n".join(m["content"] for m in messages)
    raise DataError(f"prompt must be a string or a list of chat messages, got {type(raw).__name__}")


def _ground_truth(row: dict[str, Any], path: Path, i: int) -> str:
    rm = row["reward_model"]
    if isinstance(rm, str):  # a JSON object, or the ground truth itself (which may look like JSON: "42")
        try:
            parsed = json.loads(rm)
        except json.JSONDecodeError:
            parsed = None
        rm = parsed if isinstance(parsed, dict) else {"ground_truth": rm}
    if not isinstance(rm, dict) or "ground_truth" not in rm:
        raise DataError(f"data file {path}, row {i}: reward_model has no ground_truth")
    return str(rm["ground_truth"])


def load_prompts(files: list[Path], tokenizer: Any, prompt_key: str = "prompt",
                 max_prompt_length: int = 512, tools: ToolPrompt | None = None) -> tuple[list[Prompt], int]:
    """Returns the prompts and how many were filtered out for length. `tools`: the environment's
    tools, put into every chat prompt (rlfleet/env/tool_prompt.py)."""
    prompts: list[Prompt] = []
    too_long = 0
    offset = 0  # rows of the files before this one: a prompt's index is its row in the whole data set
    from tqdm import tqdm  # a bar on a terminal for large files; nothing when stderr is not one

    for path in files:
        rows = _read_table(path, prompt_key)
        for i, row in enumerate(tqdm(rows, desc=f"tokenizing {path.name}", unit="prompt", disable=None,
                                     leave=False)):
            try:
                text = render_prompt(row[prompt_key], tokenizer, tools)
            except DataError as exc:
                raise DataError(f"data file {path}, row {i}, column {prompt_key!r}: {exc}") from None
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            if len(ids) > max_prompt_length:
                too_long += 1
                continue
            extra = row.get("extra_info") or {}
            prompts.append(Prompt(index=offset + i, text=text, prompt_ids=ids,
                                  data_source=str(row["data_source"]),
                                  ground_truth=_ground_truth(row, path, i),
                                  extra_info=extra if isinstance(extra, dict) else {}))
        offset += len(rows)
    if too_long:
        log.warning("prompts filtered for length", count=too_long, max_prompt_length=max_prompt_length)
    if not prompts:
        hint = ("; the environment's tools are in every prompt: env.tools_in_prompt=false leaves them out"
                if tools is not None and too_long else "")
        raise DataError(f"no usable prompts in {[str(f) for f in files]} ({too_long} longer than "
                        f"data.max_prompt_length={max_prompt_length}){hint}")
    return prompts, too_long


class PromptSource:
    """Endless stream over epochs; reshuffled each epoch with a seed derived from (seed, epoch)."""

    def __init__(self, prompts: list[Prompt], shuffle: bool = True, seed: int = 0):
        self.prompts = prompts
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.cursor = 0
        self._order = self._order_for(0)

    def _order_for(self, epoch: int) -> list[int]:
        order = list(range(len(self.prompts)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def next(self) -> Prompt:
        if self.cursor >= len(self._order):
            self.epoch += 1
            self.cursor = 0
            self._order = self._order_for(self.epoch)
        prompt = self.prompts[self._order[self.cursor]]
        self.cursor += 1
        return prompt

    def __iter__(self) -> Iterator[Prompt]:
        while True:
            yield self.next()
