"""Built-in task for the embedded default job: reverse a short digit string.

The prompt asks the model to write the digits of a 3-5 digit string in reverse
order; the answer is just the reversed digits (e.g. ``"Reverse the digits: 4721"``
-> ``"1274"``).  Rows follow the verl parquet schema so the same loaders work for
this task and for external datasets (e.g. GSM8K).

The reward for this task lives in ``services/reward/fns/digits.py``.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

TASK_NAME = "digits_reverse"
ABILITY = "string_manipulation"
MIN_DIGITS = 3
MAX_DIGITS = 5
PROMPT_PREFIX = "Reverse the digits: "


def make_problem(rng: random.Random) -> tuple[str, str]:
    """Draw one problem: returns ``(digit_string, reversed_answer)``."""
    length = rng.randint(MIN_DIGITS, MAX_DIGITS)
    digits = "".join(rng.choice("0123456789") for _ in range(length))
    return digits, digits[::-1]


def prompt_text(digits: str) -> str:
    """The user-message content for a digit string."""
    return f"{PROMPT_PREFIX}{digits}"


def make_rows(n: int, seed: int, split: str = "train") -> list[dict[str, Any]]:
    """``n`` task rows in the verl parquet schema, deterministic given ``seed``."""
    rng = random.Random(f"{TASK_NAME}:{split}:{seed}")
    rows = []
    for i in range(n):
        digits, answer = make_problem(rng)
        rows.append(
            {
                "data_source": TASK_NAME,
                "prompt": [{"role": "user", "content": prompt_text(digits)}],
                "ability": ABILITY,
                "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {"index": i, "split": split},
            }
        )
    return rows


def _row_schema() -> Any:
    """The columns of ``make_rows``, as ``pa.Table.from_pylist`` would infer them."""
    import pyarrow as pa

    return pa.schema([
        ("data_source", pa.string()),
        ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
        ("extra_info", pa.struct([("index", pa.int64()), ("split", pa.string())])),
    ])


def write_parquet(path: str | Path, n: int, seed: int, split: str = "train") -> Path:
    """Write ``make_rows(n, seed, split)`` to a parquet file at ``path``."""
    import io
    import json

    import pyarrow.json as pa_json
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Parsed from JSON lines with the schema given, not built by pa.Table.from_pylist: pyarrow's
    # conversion of Python objects imports pandas to check for its types, ~45 MB resident in the
    # launcher+controller's process, which writes this file and never uses pandas.
    lines = "\n".join(json.dumps(row) for row in make_rows(n, seed, split)).encode()
    table = pa_json.read_json(io.BytesIO(lines),
                              parse_options=pa_json.ParseOptions(explicit_schema=_row_schema()))
    pq.write_table(table, path)
    return path


def make_sft_pairs(n: int, seed: int, noise: float = 0.0) -> list[tuple[str, str]]:
    """Warm-start pairs ``(user_content, target_answer)`` from a "noisy teacher".

    Each answer digit is independently replaced by a uniformly random digit with
    probability ``noise`` (it may by chance stay the same), so a model fitted to
    these targets puts roughly ``1 - noise * 0.9`` of its probability on the right
    digit: it knows the format and the skill, but samples at temperature 1.0 are
    right only part of the time.
    """
    if not 0.0 <= noise <= 1.0:
        raise ValueError(f"noise must be in [0, 1], got {noise}")
    rng = random.Random(f"{TASK_NAME}:sft:{seed}")
    pairs = []
    for _ in range(n):
        digits, answer = make_problem(rng)
        target = "".join(rng.choice("0123456789") if rng.random() < noise else ch for ch in answer)
        pairs.append((prompt_text(digits), target))
    return pairs


def tokenizer_corpus(n: int = 2000, seed: int = 0) -> list[str]:
    """Task text (prompts and answers) to train the tiny tokenizer on."""
    rng = random.Random(f"{TASK_NAME}:corpus:{seed}")
    out = []
    for _ in range(n):
        digits, answer = make_problem(rng)
        out.append(prompt_text(digits))
        out.append(answer)
    return out
