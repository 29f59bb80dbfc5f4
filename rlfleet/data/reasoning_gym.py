"""reasoning-gym tasks as verl-schema rows (`rlfleet data reasoning-gym TASK[,TASK…]`).

reasoning-gym (the `reasoning-gym` package, extra `rlfleet[envs]`) has a procedural generator
and a verifier for each of its tasks. A row here is one generated entry: its question (with an
instruction to answer between `<answer>` tags) as a user message, its answer as the ground
truth, `data_source` `reasoning_gym/<task>`, the whole entry (question, answer, metadata)
as JSON in `extra_info.entry`, which is what the task's verifier scores against
(`reward.fn=reasoning_gym`, services/reward/fns/reasoning_gym.py), and the answer as the
instruction asks for it in `extra_info.answer`, which `rlfleet sft` trains on (a format warm start).

Train and test never share a question: the generator's seed is drawn from (seed, split), and
an entry belongs to the test side only when a hash of its question is odd (train: even), so two
files written with any seeds and sizes are disjoint across the splits. Several tasks are
interleaved row by row, the rows shared out as evenly as the count allows.
"""
from __future__ import annotations

import hashlib
import json
import random
from typing import Any

from rlfleet.data.convert import make_row
from rlfleet.errors import ConfigError, DataError

SOURCE_PREFIX = "reasoning_gym/"
INSTRUCTION = "Give only your final answer, between <answer> and </answer>."
SPLITS = ("train", "test")
# Entries generated per chunk, and chunks per requested row before the task is judged too small.
_CHUNK = 256
_DRAWS_PER_ROW = 40


def generator_names() -> list[str]:
    """The names reasoning-gym registers (its tasks)."""
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def parse_tasks(spec: str) -> list[str]:
    """'a,b' -> ['a', 'b'], each a registered task (else a ConfigError naming the unknown ones)."""
    tasks = [t.strip() for t in spec.split(",") if t.strip()]
    if not tasks:
        raise ConfigError("name at least one reasoning-gym task, e.g. `rlfleet data reasoning-gym chain_sum`")
    known = set(generator_names())
    unknown = [t for t in tasks if t not in known]
    if unknown:
        raise ConfigError(f"unknown reasoning-gym task(s) {', '.join(unknown)}; "
                          f"known: {', '.join(sorted(known))}")
    if len(set(tasks)) != len(tasks):
        raise ConfigError(f"a task is named twice in {spec!r}")
    return tasks


def split_of(question: str) -> str:
    """'test' when the question's hash is odd, else 'train'."""
    return "test" if hashlib.sha256(question.encode()).digest()[0] % 2 else "train"


def _entries(task: str, count: int, seed: int, split: str) -> list[dict[str, Any]]:
    """`count` distinct entries of `split`'s side from the task's generator."""
    import reasoning_gym

    rng = random.Random(f"reasoning_gym:{task}:{split}:{seed}")
    seen: set[str] = set()
    out: list[dict[str, Any]] = []
    for _ in range(max(1, count * _DRAWS_PER_ROW // _CHUNK)):
        dataset = reasoning_gym.create_dataset(task, size=_CHUNK, seed=rng.randrange(2**31))
        for entry in dataset:
            question = entry["question"]
            if question in seen or split_of(question) != split:
                continue
            seen.add(question)
            out.append(entry)
            if len(out) == count:
                return out
    raise DataError(f"reasoning-gym task {task}: only {len(out)} distinct {split} questions found for "
                    f"{count} rows; ask for fewer")


def make_rows(tasks: list[str], rows: int, seed: int = 0, split: str = "train",
              instruction: str = INSTRUCTION) -> list[dict[str, Any]]:
    """`rows` rows over `tasks` (interleaved), deterministic given the arguments."""
    if split not in SPLITS:
        raise ConfigError(f"--split {split!r}: must be one of {', '.join(SPLITS)} (they are disjoint)")
    if rows < len(tasks):
        raise ConfigError(f"--rows {rows}: at least one row per task ({len(tasks)} tasks)")
    shares = [rows // len(tasks) + (i < rows % len(tasks)) for i in range(len(tasks))]
    per_task = [_entries(task, share, seed, split) for task, share in zip(tasks, shares)]
    out: list[dict[str, Any]] = []
    for position in range(max(shares)):
        for task, entries in zip(tasks, per_task):
            if position < len(entries):
                out.append(_row(task, entries[position], split, len(out), instruction))
    return out


def _row(task: str, entry: dict[str, Any], split: str, index: int, instruction: str) -> dict[str, Any]:
    content = f"{entry['question'].rstrip()}\n\n{instruction}".strip() if instruction else entry["question"]
    answer = str(entry["answer"])
    return make_row(
        SOURCE_PREFIX + task, [{"role": "user", "content": content}], "reasoning", answer,
        {"split": split, "index": index, "task": task,
         # the response a warm start trains on (`rlfleet sft`'s default --response-key): the answer as
         # the instruction asks for it, since a small model may not write the tags until taught
         "answer": f"<answer>{answer}</answer>" if "<answer>" in instruction else answer,
         # JSON: entries of different tasks have metadata of different shapes (one Parquet column)
         "entry": json.dumps({"question": entry["question"], "answer": entry["answer"],
                              "metadata": entry.get("metadata", {})}, default=str)},
    )
