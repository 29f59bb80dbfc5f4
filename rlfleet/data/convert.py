"""Dataset preparation: JSONL files -> Parquet in the verl schema.

Every row written has `data_source`, `prompt` (a chat message list), `ability`,
`reward_model` ({style, ground_truth}) and `extra_info` ({split, index, ...}),
so files made here and files made by verl's own preprocessing scripts load the
same way. A field that is not in the input is an error that names the file and
lists the fields it does have.

`filter_by_length` renders each prompt with the tokenizer's chat template and
drops (never truncates) the ones longer than the limit, returning how many.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rlfleet.errors import DataError

GSM8K_SOURCE = "openai/gsm8k"
GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
_GSM8K_FINAL = re.compile(r"####\s*(.+?)\s*$", re.DOTALL)


def _progress(items: Iterable, desc: str, total: int | None = None) -> Iterable:
    """A tqdm bar on a terminal; plain iteration when stderr is not one (tests, logs)."""
    from tqdm import tqdm

    return tqdm(items, desc=desc, total=total, unit="row", disable=None, leave=False)


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """One JSON object per line; blank lines are skipped. Errors name the file and line."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"input file {path} does not exist")
    records = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path} line {line_no} is not valid JSON: {exc.msg}") from None
            if not isinstance(record, dict):
                raise DataError(f"{path} line {line_no} is a JSON {type(record).__name__}, not an object")
            records.append(record)
    if not records:
        raise DataError(f"input file {path} has no records")
    return records


def _fields_of(records: list[dict[str, Any]]) -> list[str]:
    seen: dict[str, None] = {}
    for record in records:
        seen.update(dict.fromkeys(record))
    return list(seen)


def require_fields(records: list[dict[str, Any]], path: str | Path, fields: dict[str, str]) -> None:
    """`fields` maps each needed field to what asked for it (an option name) for the message."""
    available = _fields_of(records)
    for name, asked_by in fields.items():
        if name not in available:
            raise DataError(
                f"{path} has no field {name!r} ({asked_by}); its fields are: {', '.join(available)}"
            )
        for i, record in enumerate(records):
            if record.get(name) is None:
                raise DataError(
                    f"{path} record {i + 1} has no value for field {name!r} ({asked_by}); "
                    f"its fields are: {', '.join(record)}"
                )


def gsm8k_final_answer(answer: str) -> str:
    """`...#### 1,234` -> `1234`; raises ValueError when there is no `####` marker."""
    match = _GSM8K_FINAL.search(str(answer))
    if match is None:
        raise ValueError("no '#### N' final answer")
    return match.group(1).replace(",", "").replace("$", "").strip()


def _messages(prompt: Any, instruction: str, path: str | Path, index: int) -> list[dict[str, str]]:
    if isinstance(prompt, str):
        content = f"{prompt} {instruction}".strip() if instruction else prompt
        return [{"role": "user", "content": content}]
    if isinstance(prompt, list) and prompt and all(isinstance(m, dict) and "content" in m for m in prompt):
        messages = [{"role": str(m.get("role", "user")), "content": str(m["content"])} for m in prompt]
        if instruction:
            messages[-1]["content"] = f"{messages[-1]['content']} {instruction}".strip()
        return messages
    raise DataError(
        f"{path} record {index + 1}: the prompt must be a string or a list of chat messages "
        f"({{role, content}}), got {type(prompt).__name__}"
    )


def make_row(
    data_source: str,
    messages: list[dict[str, str]],
    ability: str,
    ground_truth: str,
    extra_info: dict[str, Any],
) -> dict[str, Any]:
    return {
        "data_source": data_source,
        "prompt": messages,
        "ability": ability,
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": extra_info,
    }


def gsm8k_rows(
    records: list[dict[str, Any]],
    path: str | Path,
    split: str = "train",
    instruction: str = GSM8K_INSTRUCTION,
) -> list[dict[str, Any]]:
    """GSM8K's `{question, answer}` records, with the number after `####` as the ground truth."""
    require_fields(records, path, {"question": "GSM8K question", "answer": "GSM8K answer"})
    rows = []
    for i, record in enumerate(_progress(records, "gsm8k")):
        try:
            truth = gsm8k_final_answer(record["answer"])
        except ValueError:
            raise DataError(
                f"{path} record {i + 1}: field 'answer' has no '#### N' final answer: "
                f"{str(record['answer'])[-80:]!r}"
            ) from None
        rows.append(
            make_row(
                GSM8K_SOURCE,
                _messages(str(record["question"]), instruction, path, i),
                "math",
                truth,
                {
                    "split": split,
                    "index": i,
                    "question": str(record["question"]),
                    "answer": str(record["answer"]),
                },
            )
        )
    return rows


def jsonl_rows(
    records: list[dict[str, Any]],
    path: str | Path,
    prompt_key: str,
    answer_key: str,
    data_source: str,
    ability: str = "general",
    split: str = "train",
    instruction: str = "",
) -> list[dict[str, Any]]:
    """Any JSONL: the prompt (a string or a message list) from `prompt_key`, the ground truth from
    `answer_key` (stored as text, as verl does)."""
    require_fields(records, path, {prompt_key: "--prompt-key", answer_key: "--answer-key"})
    rows = []
    for i, record in enumerate(_progress(records, "jsonl")):
        answer = record[answer_key]
        truth = answer if isinstance(answer, str) else json.dumps(answer)
        rows.append(
            make_row(
                data_source,
                _messages(record[prompt_key], instruction, path, i),
                ability,
                truth,
                {"split": split, "index": i},
            )
        )
    return rows


def filter_by_length(
    rows: list[dict[str, Any]], tokenizer: Any, max_prompt_length: int
) -> tuple[list[dict[str, Any]], int]:
    """Rows whose chat-templated prompt fits in `max_prompt_length` tokens, and how many did not."""
    from rlfleet.data.prompts import render_prompt

    kept = []
    for row in _progress(rows, "length check"):
        ids = tokenizer(render_prompt(row["prompt"], tokenizer), add_special_tokens=False)["input_ids"]
        if len(ids) <= max_prompt_length:
            kept.append(row)
    return kept, len(rows) - len(kept)


def write_rows(rows: list[dict[str, Any]], output: str | Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not rows:
        raise DataError(f"nothing to write to {output}: no rows are left")
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp")
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    tmp.replace(output)
    return output
