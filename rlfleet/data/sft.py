"""Supervised examples for `rlfleet sft`: (prompt, response) pairs as the policy would see them.

Rows come from Parquet in verl's schema (the prompt column, a chat message list or a string, and a
response column) or from JSONL with the same fields. A column may be nested, written with dots:
`extra_info.answer` is where `rlfleet data gsm8k` and `rlfleet data arithmetic` keep the worked
answer (verl's SFT config reaches it as `response_key: extra_info` + `response_dict_keys: [answer]`).

Tokens follow the chat template, as the rollout sees them: the prompt is rendered exactly as for
generation (`render_prompt`, with the generation prompt), and the response tokens are what the
template appends for the assistant turn, up to and including the first end-of-turn token: the
rollout stops generating there, so that is where the model must learn to stop. Loss is taken on
the response tokens only. A tokenizer without a chat template gets the response text plus EOS.

A row with a `messages` column (`messages_key`) is a multi-turn conversation instead (OpenAI
messages with tool calls and tool results, and the tools offered in a `tools` column: what `rlfleet
data traces` writes, verl's multi-turn SFT and TRL's messages+tools data sets): rendered as the
agent loop renders an episode (rlfleet/data/conversation.py), loss on the assistant turns only.
"""
from __future__ import annotations

import json
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from rlfleet.data.prompts import render_prompt
from rlfleet.errors import DataError


@dataclass(frozen=True)
class SftExample:
    index: int  # row in the data set (rows of the files in order)
    prompt_ids: list[int]
    response_ids: list[int]  # loss is taken on these (where response_mask is 1)
    # per response token, 0: shown to the model (a tool result), not trained on; None: all 1
    response_mask: list[int] | None = None


def read_rows(path: Path) -> list[dict[str, Any]]:
    """A Parquet or JSONL file's rows; errors name the file."""
    if not path.is_file():
        raise DataError(f"SFT data file {path} does not exist")
    if path.suffix in (".jsonl", ".json"):
        from rlfleet.data.convert import read_jsonl

        return read_jsonl(path)
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a bad file
        raise DataError(f"SFT data file {path} is neither JSONL (.jsonl) nor readable Parquet: "
                        f"{exc}") from None


def field(row: dict[str, Any], key: str) -> Any:
    """`row[key]`, following dots into nested objects (`extra_info.answer`); KeyError if absent."""
    value: Any = row
    for part in key.split("."):
        if isinstance(value, str) and part != key:  # a nested column stored as JSON text
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                raise KeyError(key) from None
        if not isinstance(value, dict) or value.get(part) is None:
            raise KeyError(key)
        value = value[part]
    return value


def _eos_ids(tokenizer: Any, eos_ids: list[int] | None) -> list[int]:
    ids = list(eos_ids or [])
    if not ids and tokenizer.eos_token_id is not None:
        ids = [tokenizer.eos_token_id]
    if not ids:
        raise DataError("the model's tokenizer has no EOS token: SFT could not teach the model to stop")
    return ids


def tokenize_pair(tokenizer: Any, prompt: Any, response: str,
                  eos_ids: list[int]) -> tuple[list[int], list[int]]:
    """(prompt_ids, response_ids) as the rollout would see the prompt and generate the response."""
    prompt_text = render_prompt(prompt, tokenizer)
    prompt_ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    if isinstance(prompt, list) and getattr(tokenizer, "chat_template", None):
        messages = [{"role": m.get("role", "user"), "content": m["content"]} for m in prompt]
        full = tokenizer.apply_chat_template([*messages, {"role": "assistant", "content": response}],
                                             tokenize=False)
        if full.startswith(prompt_text):
            ids = tokenizer(full[len(prompt_text):], add_special_tokens=False)["input_ids"]
            ends = [k for k, t in enumerate(ids) if t in eos_ids]
            if ends:  # what the template adds after the end of turn (a newline) is never generated
                return prompt_ids, ids[:ends[0] + 1]
            return prompt_ids, [*ids, eos_ids[0]]
    return prompt_ids, [*tokenizer(response, add_special_tokens=False)["input_ids"], eos_ids[0]]


def load_examples(files: list[Path], tokenizer: Any, prompt_key: str, response_key: str,
                  max_length: int, eos_ids: list[int] | None = None, messages_key: str = "messages",
                  tools_key: str = "tools") -> tuple[list[SftExample], int]:
    """Every usable row as an example, and how many were left out for being longer than
    `max_length` tokens (prompt + response; never truncated). A row with `messages_key` is a
    conversation (its tools in `tools_key`), any other a (prompt, response) pair."""
    with _no_length_limit(tokenizer):
        return _load_examples(files, tokenizer, prompt_key, response_key, max_length,
                              _eos_ids(tokenizer, eos_ids), messages_key, tools_key)


@contextmanager
def _no_length_limit(tokenizer: Any) -> Iterator[None]:
    """The rows are measured here and the long ones left out against max_length: the tokenizer's own
    limit would only print transformers' "Token indices sequence length is longer than the specified
    maximum" for each of them (issue 32). Lifted while they are tokenized, then put back."""
    limit = getattr(tokenizer, "model_max_length", None)
    if limit is None:
        yield
        return
    tokenizer.model_max_length = int(1e30)  # transformers' own "no limit" (VERY_LARGE_INTEGER)
    try:
        yield
    finally:
        tokenizer.model_max_length = limit


def _load_examples(files: list[Path], tokenizer: Any, prompt_key: str, response_key: str, max_length: int,
                   eos: list[int], messages_key: str, tools_key: str) -> tuple[list[SftExample], int]:
    examples: list[SftExample] = []
    too_long = offset = 0
    conversations = None
    for path in files:
        rows = read_rows(path)
        for i, row in enumerate(rows):
            if row.get(messages_key) is not None:
                if conversations is None:
                    from rlfleet.data.conversation import ConversationRenderer

                    conversations = ConversationRenderer(tokenizer, eos)
                rendered = conversations.render(row[messages_key], row.get(tools_key),
                                                f"SFT data file {path}, row {i}")
                if len(rendered.prompt_ids) + len(rendered.response_ids) > max_length:
                    too_long += 1
                    continue
                examples.append(SftExample(offset + i, rendered.prompt_ids, rendered.response_ids,
                                           rendered.response_mask))
                continue
            values = []
            for key, option in ((prompt_key, "--prompt-key"), (response_key, "--response-key")):
                try:
                    values.append(field(row, key))
                except KeyError:
                    raise DataError(f"SFT data file {path}, row {i}: no value for {key!r} ({option}); its "
                                    f"columns are: {', '.join(row)}") from None
            prompt, response = values
            if not isinstance(response, str):
                raise DataError(f"SFT data file {path}, row {i}: {response_key!r} is a "
                                f"{type(response).__name__}, not text")
            try:
                prompt_ids, response_ids = tokenize_pair(tokenizer, prompt, response, eos)
            except DataError as exc:
                raise DataError(f"SFT data file {path}, row {i}, {prompt_key!r}: {exc}") from None
            if len(prompt_ids) + len(response_ids) > max_length:
                too_long += 1
                continue
            examples.append(SftExample(offset + i, prompt_ids, response_ids))
        offset += len(rows)
    if not examples:
        raise DataError(f"no usable SFT examples in {[str(f) for f in files]} ({too_long} longer than "
                        f"{max_length} tokens)")
    return examples, too_long


@lru_cache(maxsize=4)
def epoch_order(count: int, seed: int, epoch: int) -> tuple[int, ...]:
    """The examples' order in one epoch: a shuffle fixed by (seed, epoch), so a resumed run sees the
    same batches it would have seen."""
    order = list(range(count))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return tuple(order)


def batch_for_step(examples: list[SftExample], batch_size: int, step: int, seed: int) -> list[SftExample]:
    """The examples of optimizer step `step` (1-based): consecutive slices of each epoch's order; an
    epoch's last, short slice is topped up from the next epoch's order."""
    start = (step - 1) * batch_size
    out = []
    for position in range(start, start + batch_size):
        epoch, k = divmod(position, len(examples))
        out.append(examples[epoch_order(len(examples), seed, epoch)[k]])
    return out
