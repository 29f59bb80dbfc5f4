"""Math answer equivalence through the `math-verify` library.

The ground truth and the completion are parsed as LaTeX or plain expressions
(``\\boxed{…}`` preferred) and compared symbolically: ``\\frac{1}{2}``, ``0.5``
and ``1/2`` are equal, so are ``\\sqrt{8}`` and ``2\\sqrt{2}``. 1.0 when equal,
0.0 when the completion holds no answer or a different one. A ground truth that
cannot be parsed raises, so the sample is reported instead of being scored 0.

math-verify's own timeouts use SIGALRM, which works only on a main thread; the
reward service scores on gRPC worker threads, so they are turned off here.
"""
from __future__ import annotations

import logging

# Both loggers warn on every call that their SIGALRM timeouts are off, which is deliberate here.
for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).setLevel(logging.ERROR)


def _parse(text: str):
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    config = [LatexExtractionConfig(), ExprExtractionConfig()]
    return parse(text, extraction_config=config, parsing_timeout=None)


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None,
                  correct: float = 1.0, wrong: float = 0.0) -> float:
    from math_verify import verify

    truth = str(ground_truth).strip()
    gold = _parse(truth if "$" in truth or "\\boxed" in truth else f"${truth}$")
    if not gold:
        gold = _parse(truth)
    if not gold:
        raise ValueError(f"math reward: cannot parse the ground truth {truth!r}")
    answer = _parse(solution_str or "")
    if not answer:
        return float(wrong)
    return float(correct) if verify(gold, answer, timeout_seconds=None) else float(wrong)
