"""The lenient final-number rule: `gsm8k_lenient`, and `arithmetic` (data_source `rlfleet/arithmetic`).

The answer is the number after the last ``####`` marker when one is present,
otherwise the last number anywhere in the text. Commas, dollar signs and a
trailing full stop are stripped before comparing; numbers are compared by value
(so ``"18.00"`` equals ``"18"``). Returns ``score`` (1.0) when right,
``format_score`` (0.0 by default) when an answer was found but is wrong, and
0.0 when no answer could be extracted. Never raises.

A response cut at the token budget (``extra_info["finish_reason"] == "length"``,
which rlfleet's reward service adds from the score request) scores 0.0 whatever it
contains: without this gate the last-number fallback credits coincidental numbers
of an unfinished response ("Step 5"). A response whose ending is unknown (no
finish reason, e.g. from a caller outside rlfleet) is scored as one that ended on
its own.

This was rlfleet's `gsm8k` rule before `gsm8k` became verl's `compute_score`
(services/reward/fns/gsm8k.py); it credits more than verl's strict or flexible methods.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_NUMBER = re.compile(r"-?[0-9][0-9,]*(?:\.[0-9]+)?|-?\.[0-9]+")
TRUNCATED = "length"


def normalize_number(text: str) -> str:
    """Strip whitespace, ``$``, commas and a trailing period."""
    s = text.strip().replace(",", "").replace("$", "").strip()
    while s.endswith("."):
        s = s[:-1]
    return s


def extract_answer(solution_str: object) -> str | None:
    """The final answer string (normalised), or None if there is none."""
    if not isinstance(solution_str, str):
        return None
    text = solution_str
    if "####" in text:
        tail = text.rsplit("####", 1)[1].replace("$", "")
        match = _NUMBER.search(tail)
        return normalize_number(match.group(0)) if match else None
    numbers = _NUMBER.findall(text.replace("$", ""))
    if not numbers:
        return None
    return normalize_number(numbers[-1]) or None


def was_truncated(extra_info: dict | None) -> bool:
    return isinstance(extra_info, dict) and extra_info.get("finish_reason") == TRUNCATED


def _same(a: str, b: str) -> bool:
    try:
        return Decimal(a) == Decimal(b)
    except (InvalidOperation, ValueError):
        return a == b


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict | None = None,
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    try:
        if was_truncated(extra_info):
            return 0.0
        answer = extract_answer(solution_str)
        if answer is None:
            return 0.0
        truth = normalize_number(str(ground_truth))
        if "####" in truth:
            truth = extract_answer(truth) or ""
        return float(score) if _same(answer, truth) else float(format_score)
    except Exception:  # noqa: BLE001 - a reward must never crash the service
        return 0.0
