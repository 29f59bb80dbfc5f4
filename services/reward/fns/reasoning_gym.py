"""reasoning-gym's own verifiers (`reward.fn=reasoning_gym`; `auto` for data_source `reasoning_gym/*`).

The response's answer is the text of its last `<answer>…</answer>`; a response without the tags
gives its last non-empty line instead (`require_tags=True`: scores 0). The task's verifier
(`score_answer` of the task named by `extra_info.task`, else by data_source `reasoning_gym/<task>`)
then scores it against the entry the row was generated from (`extra_info.entry`, written by
`rlfleet data reasoning-gym`); a row without one is scored against its ground truth alone, which
is enough for tasks whose verifier compares with the answer only. Scores are the verifier's, in
[0, 1] (some tasks give partial credit).
"""
from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from typing import Any

SOURCE_PREFIX = "reasoning_gym/"  # as rlfleet.data.reasoning_gym writes it
_ANSWER = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)


def extract_answer(response: str, require_tags: bool = False) -> str | None:
    matches = _ANSWER.findall(response or "")
    if matches:
        return matches[-1].strip()
    if require_tags:
        return None
    lines = [line.strip() for line in (response or "").splitlines() if line.strip()]
    return lines[-1] if lines else None


@functools.lru_cache(maxsize=None)
def verifier(task: str) -> Callable[[str | None, dict[str, Any]], float]:
    import reasoning_gym

    try:
        return reasoning_gym.get_score_answer_fn(task)
    except ValueError:
        raise ValueError(f"no reasoning-gym task {task!r} (data_source {SOURCE_PREFIX}{task})") from None


def task_of(data_source: str, extra_info: dict[str, Any]) -> str:
    task = extra_info.get("task") or (data_source[len(SOURCE_PREFIX):]
                                      if data_source.startswith(SOURCE_PREFIX) else "")
    if not task:
        raise ValueError(f"data_source {data_source!r} names no reasoning-gym task: expected "
                         f"{SOURCE_PREFIX}<task> or extra_info.task")
    return task


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None,
                  require_tags: bool = False) -> float:
    extra_info = extra_info or {}
    raw = extra_info.get("entry")
    entry = json.loads(raw) if isinstance(raw, str) and raw else dict(raw or {})
    entry.setdefault("answer", ground_truth)
    entry.setdefault("metadata", {})
    score_answer = verifier(task_of(data_source, extra_info))
    return float(score_answer(extract_answer(solution_str, require_tags), entry))
