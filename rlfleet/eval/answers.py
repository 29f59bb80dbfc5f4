"""What a collapsed policy looks like in numbers: the majority-answer baseline and answer diversity.

A policy can raise its accuracy by always giving the task's most frequent ground truth. The
*majority-answer baseline* is the accuracy of doing exactly that (one ground truth per prompt);
an accuracy near it says nothing was learned beyond the answer distribution. *Answer diversity*
counts the distinct answers the model gave and the share of the most common one: a share near 1
is a collapse onto one answer.

The answer of a response is read by one fixed rule, whatever reward scored it (the reward rules
live in the reward service; these numbers must be comparable across them): the last
`<answer>…</answer>`, else the last `\\boxed{…}`, else what follows the last `####` (its leading
number when it starts with one), else the last number, else the whole text (whitespace collapsed,
first MAX_ANSWER_CHARS characters).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

MAX_ANSWER_CHARS = 40

_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_HASHES = re.compile(r"####([^\n]*)")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_SPACES = re.compile(r"\s+")


def _clean(text: str) -> str:
    """Whitespace collapsed; a number loses its thousands commas and a trailing full stop."""
    text = _SPACES.sub(" ", text).strip().rstrip(".").strip()
    if _NUMBER.fullmatch(text):
        text = text.replace(",", "")
    return text[:MAX_ANSWER_CHARS]


def _after_hashes(text: str) -> str:
    """What follows `####`: its leading number when it starts with one (`#### 72 apples` -> 72)."""
    leading = _NUMBER.match(text.strip())
    return leading.group(0) if leading else text


def answer_of(response: str) -> str:
    """The answer a response gives, by the rule of the module docstring ('' for an empty response)."""
    for pattern in (_TAG, _BOXED):
        found = pattern.findall(response)
        if found:
            return _clean(found[-1])
    found = _HASHES.findall(response)
    if found:
        return _clean(_after_hashes(found[-1]))
    numbers = _NUMBER.findall(response)
    return _clean(numbers[-1] if numbers else response)


def truth_of(ground_truth: str) -> str:
    """A ground truth as an answer: what follows its last `####` when it has one (GSM8K's full
    solutions), else itself, cleaned as answers are."""
    found = _HASHES.findall(ground_truth)
    return _clean(_after_hashes(found[-1]) if found else ground_truth)


@dataclass(frozen=True)
class Majority:
    """The most frequent value of a list, how often it occurs, and the number of distinct values."""

    value: str
    count: int
    total: int
    distinct: int

    @property
    def share(self) -> float:
        return self.count / self.total


def majority(values: Iterable[str]) -> Majority | None:
    """None for no values; ties go to the value seen first."""
    counts = Counter(values)
    if not counts:
        return None
    value, count = counts.most_common(1)[0]
    return Majority(value, count, sum(counts.values()), len(counts))
