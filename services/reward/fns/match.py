"""Exact and regular-expression matching against the ground truth.

`exact_match`: 1.0 when the completion (stripped; optionally case-folded, or only
its last non-empty line) equals the ground truth, else 0.0.

`regex_match`: with `pattern`, the answer is the first match of the pattern in the
completion (its first group when it has groups) and must equal the ground truth;
without, the ground truth is itself the pattern the whole stripped completion
must match. A pattern that does not compile raises (the sample is reported).
"""
from __future__ import annotations

import re


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def exact_match(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None,
                case_sensitive: bool = True, last_line: bool = False) -> float:
    answer = _last_line(solution_str or "") if last_line else (solution_str or "").strip()
    truth = str(ground_truth).strip()
    if not case_sensitive:
        answer, truth = answer.casefold(), truth.casefold()
    return float(answer == truth)


def regex_match(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None,
                pattern: str | None = None) -> float:
    text = solution_str or ""
    if pattern is None:
        return float(re.fullmatch(str(ground_truth), text.strip(), re.DOTALL) is not None)
    match = re.search(pattern, text, re.DOTALL)
    if match is None:
        return 0.0
    answer = match.group(1) if match.groups() else match.group(0)
    return float((answer or "").strip() == str(ground_truth).strip())
