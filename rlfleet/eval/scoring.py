"""Pure aggregation of scored evaluation samples: accuracy, pass@k, mean length, the share of
clipped responses, and against collapse the majority-answer baseline and the answers' diversity
(rlfleet/eval/answers.py).

A sample is *correct* when its reward reaches `correct_at` (1.0, the full score,
by default: an exact GSM8K answer or an exactly reversed digit string). A sample
whose reward could not be computed is counted under `reward_failed` and left out
of every mean; it is never scored 0.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from rlfleet.eval.answers import answer_of, majority, truth_of

CORRECT_AT = 1.0


@dataclass(frozen=True)
class EvalSample:
    prompt_index: int
    data_source: str
    sample: int  # index within the prompt's n samples
    prompt: str
    response: str
    ground_truth: str
    length: int  # response tokens
    finish_reason: str
    policy_version: int
    reward: float | None  # None: the reward could not be computed
    error: str = ""
    # Multi-turn episodes (an environment): model turns taken, tool calls parsed from them, tool calls
    # the environment reported as errors. 0 for a single-turn sample.
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    # The answer the response gives (rlfleet.eval.answers.answer_of of its final turn; None: read from
    # `response`) and its mean negative log-prob per generated token (None: the engine gave none)
    answer: str | None = None
    nll: float | None = None
    tool_format_errors: int = 0  # tool-call openings never closed (rlfleet/env/toolcalls.py)

    def correct(self, correct_at: float = CORRECT_AT) -> bool:
        return self.reward is not None and self.reward >= correct_at


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of P(at least one of k samples is correct) from n samples with c correct:
    1 - C(n-c, k) / C(n, k), computed as a product so large n does not overflow."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def default_ks(n: int) -> list[int]:
    """1, 2, 4, ... up to n, and n itself."""
    ks = [1 << i for i in range(n.bit_length()) if (1 << i) <= n]
    return ks if ks[-1] == n else [*ks, n]


def _summarize_group(samples: list[EvalSample], ks: list[int], correct_at: float) -> dict[str, Any]:
    scored = [s for s in samples if s.reward is not None]
    by_prompt: dict[int, list[EvalSample]] = defaultdict(list)
    for s in scored:
        by_prompt[s.prompt_index].append(s)
    summary: dict[str, Any] = {
        "prompts": len({s.prompt_index for s in samples}),
        "samples": len(samples),
        "reward_failed": len(samples) - len(scored),
        "accuracy": (sum(s.correct(correct_at) for s in scored) / len(scored)) if scored else None,
        "reward_mean": (sum(s.reward for s in scored) / len(scored)) if scored else None,
        "response_length_mean": (sum(s.length for s in samples) / len(samples)) if samples else None,
        # responses that hit max_new_tokens: cut off, their answer (if any) unfinished
        "clipped": (sum(s.finish_reason == "length" for s in samples) / len(samples)) if samples else None,
    }
    nlls = [s.nll for s in samples if s.nll is not None]
    summary["nll_mean"] = sum(nlls) / len(nlls) if nlls else None
    summary.update(_collapse(samples))
    for k in ks:
        estimates = [
            pass_at_k(len(group), sum(s.correct(correct_at) for s in group), k)
            for group in by_prompt.values()
            if len(group) >= k
        ]
        summary[f"pass@{k}"] = sum(estimates) / len(estimates) if estimates else None
    if any(s.turns for s in samples):  # episodes: what the agent loop did, over every episode
        summary["turns_mean"] = sum(s.turns for s in samples) / len(samples)
        summary["tool_calls_mean"] = sum(s.tool_calls for s in samples) / len(samples)
        summary["tool_errors"] = sum(s.tool_errors for s in samples)
        summary["tool_format_errors"] = sum(s.tool_format_errors for s in samples)
    return summary


def _collapse(samples: list[EvalSample]) -> dict[str, Any]:
    """The majority-answer baseline (one ground truth per prompt) and the answers' diversity
    (rlfleet/eval/answers.py)."""
    truths = majority(truth_of(s.ground_truth) for s in {s.prompt_index: s for s in samples}.values())
    answers = majority(s.answer if s.answer is not None else answer_of(s.response) for s in samples)
    return {
        "majority_answer": truths.value if truths else None,
        "majority_baseline": truths.share if truths else None,
        "answers_distinct": answers.distinct if answers else None,
        "top_answer": answers.value if answers else None,
        "top_answer_share": answers.share if answers else None,
    }


def summarize(samples: list[EvalSample], n: int, correct_at: float = CORRECT_AT) -> dict[str, Any]:
    """{"by_source": {data_source: summary}, "overall": summary} with pass@k for k in default_ks(n)."""
    ks = default_ks(n)
    by_source: dict[str, list[EvalSample]] = defaultdict(list)
    for s in samples:
        by_source[s.data_source].append(s)
    sources = {src: _summarize_group(group, ks, correct_at) for src, group in sorted(by_source.items())}
    overall = _summarize_group(samples, ks, correct_at)
    if sources:
        # over all sources: always giving each source's own most frequent ground truth, so prompts
        # weigh as they do in the overall accuracy (one pooled majority would mix unrelated answers)
        overall["majority_answer"] = None
        overall["majority_baseline"] = (
            sum(s["majority_baseline"] * s["prompts"] for s in sources.values()) / overall["prompts"]
        )
    return {
        "by_source": sources,
        "overall": overall,
        "ks": ks,
        "correct_at": correct_at,
    }


def flat_metrics(summary: dict[str, Any], prefix: str = "val") -> dict[str, float]:
    """Metric lines for metrics.jsonl: `val/<data_source>/accuracy`, `.../majority_baseline`,
    `.../answers/distinct`, `.../answers/top_share`, `.../reward/mean`, `.../response_length/mean`,
    `.../response_length/clip_ratio`, `.../nll/mean` (when the engine gave log-probs), `.../pass@k`
    (k > 1), with episodes `.../turns/mean`, `.../tool_calls/mean` and `.../tool_errors`, and the same
    over all sources as `val/...`."""
    out: dict[str, float] = {}
    groups = [(f"{prefix}/{src}", s) for src, s in summary["by_source"].items()]
    groups.append((prefix, summary["overall"]))
    for name, s in groups:
        for key, value in (
            ("accuracy", s["accuracy"]),
            ("reward/mean", s["reward_mean"]),
            ("response_length/mean", s["response_length_mean"]),
            ("reward_failed", float(s["reward_failed"])),
            ("majority_baseline", s.get("majority_baseline")),
            ("answers/distinct", s.get("answers_distinct")),
            ("answers/top_share", s.get("top_answer_share")),
            ("response_length/clip_ratio", s.get("clipped")),
            ("nll/mean", s.get("nll_mean")),
            ("turns/mean", s.get("turns_mean")),
            ("tool_calls/mean", s.get("tool_calls_mean")),
            ("tool_errors", s.get("tool_errors")),
            ("tool_format_errors", s.get("tool_format_errors")),
        ):
            if value is not None:
                out[f"{name}/{key}"] = float(value)
        for k in summary["ks"]:
            if k > 1 and s.get(f"pass@{k}") is not None:
                out[f"{name}/pass@{k}"] = float(s[f"pass@{k}"])
    return out
