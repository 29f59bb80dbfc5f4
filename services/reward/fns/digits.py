"""Reward for the built-in ``digits_reverse`` task (see ``rlfleet.data.tasks``).

Dense score in [0, 1]: the predicted answer is the first run of digits in the
completion; the score is the number of positions where it agrees with the
ground truth, divided by the longer of the two lengths.  So an exact answer
scores 1.0, a wrong digit costs ``1/len``, missing or extra digits are
penalised, and a completion with no digits scores 0.0.  Never raises.
"""

from __future__ import annotations

import re

_DIGIT_RUN = re.compile(r"[0-9]+")


def extract_answer(solution_str: object) -> str | None:
    """First run of ASCII digits in the completion, or None."""
    if not isinstance(solution_str, str):
        return None
    match = _DIGIT_RUN.search(solution_str)
    return match.group(0) if match else None


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict | None = None,
) -> float:
    try:
        truth = "".join(ch for ch in str(ground_truth).strip() if ch in "0123456789")
        pred = extract_answer(solution_str)
        if not pred or not truth:
            return 0.0
        matches = sum(1 for a, b in zip(pred, truth) if a == b)
        return matches / max(len(pred), len(truth))
    except Exception:  # noqa: BLE001 - a reward must never crash the service
        return 0.0
