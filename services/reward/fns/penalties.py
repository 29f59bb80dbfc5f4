"""Shaping terms, meant to be combined with a correctness reward in `reward.sources`.

`format_reward`: `reward` when the whole stripped completion matches `pattern`
(by default ``<think>…</think>`` then ``<answer>…</answer>``), else `penalty`.

`length_penalty`: 0 up to `max_length - buffer` units, then falls linearly to
`-1` at `max_length`, and stays `-1` beyond (DAPO's soft overlong penalty), with
units of characters or whitespace-separated words (the reward sees text, not
tokens). Scale it with the source's weight.
"""
from __future__ import annotations

import re

DEFAULT_FORMAT = r"<think>.*?</think>\s*<answer>.*?</answer>"


def format_reward(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None,
                  pattern: str = DEFAULT_FORMAT, reward: float = 1.0, penalty: float = 0.0) -> float:
    ok = re.fullmatch(pattern, (solution_str or "").strip(), re.DOTALL) is not None
    return float(reward if ok else penalty)


def length_penalty(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None,
                   max_length: int = 1024, buffer: int = 256, unit: str = "chars") -> float:
    if unit not in ("chars", "words"):
        raise ValueError(f"length_penalty: unit must be chars or words, not {unit!r}")
    if not 0 < buffer <= max_length:
        raise ValueError(f"length_penalty: need 0 < buffer <= max_length, got {buffer}, {max_length}")
    text = solution_str or ""
    length = len(text) if unit == "chars" else len(text.split())
    free = max_length - buffer
    if length <= free:
        return 0.0
    if length >= max_length:
        return -1.0
    return -(length - free) / buffer
