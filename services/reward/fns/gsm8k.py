"""GSM8K scored as verl scores it (`verl.utils.reward_score.gsm8k.compute_score`), so accuracies
measured here can be set beside verl's.

Only the last 300 characters of the response are read (verl's clip: the final
answer sits at the end, and a regex over a long text is slow). Two methods:

- ``strict`` (verl's default, `reward.fn=gsm8k` and `auto` for `openai/gsm8k`): the
  answer is the last ``#### N`` in that tail, N being a run of digits, dots and commas
  with an optional leading minus and exactly one space after ``####``. Commas are
  removed (``#### 1,234`` -> ``1234``); a dollar sign cannot be part of N, so
  ``#### $5`` has no answer. No ``####``, no answer: the last number is never taken.
- ``flexible`` (`reward.fn=gsm8k_flexible`): the last such run anywhere in the tail
  that is not a lone ``.``, taken as it stands (commas kept: ``1,234`` != ``1234``).

The answer must equal the ground truth *as text*: a trailing full stop (``#### 8.``
reads ``8.``) or ``18.00`` against ``18`` is wrong. Returns ``score`` (1.0) when
equal, ``format_score`` (0.0, verl's default) when an answer was found but differs,
and 0.0 when none was found. Never raises. verl's source is reference only; this is
a re-implementation of its behaviour, pinned by tests/unit/test_gsm8k_verl_rule.py.
"""

from __future__ import annotations

import re

TAIL_CHARS = 300
_STRICT = re.compile(r"#### (-?[0-9.,]+)")
_ANY_NUMBER = re.compile(r"-?[0-9.,]+")
METHODS = ("strict", "flexible")


def extract_answer(solution_str: str, method: str = "strict") -> str | None:
    """The answer verl's method reads from the response, or None."""
    if method not in METHODS:
        raise ValueError(f"gsm8k method must be one of {METHODS}, not {method!r}")
    tail = solution_str[-TAIL_CHARS:]
    if method == "strict":
        marked = _STRICT.findall(tail)
        return marked[-1].replace(",", "") if marked else None
    found = _ANY_NUMBER.findall(tail)
    for candidate in reversed(found):
        if candidate != ".":
            return candidate
    # verl's loop ends on its first element when every run is a lone ".": an answer, never equal
    return found[0] if found else None


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict | None = None,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    if method not in METHODS:  # a bad `params` is a configuration error, not a zero reward
        raise ValueError(f"gsm8k method must be one of {METHODS}, not {method!r}")
    if not isinstance(solution_str, str):
        return 0.0
    answer = extract_answer(solution_str, method)
    if answer is None:
        return 0.0
    return float(score) if answer == str(ground_truth) else float(format_score)


def compute_score_flexible(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict | None = None,
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """verl's `method="flexible"`."""
    return compute_score(data_source, solution_str, ground_truth, extra_info, "flexible", format_score, score)
