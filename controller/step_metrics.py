"""One metrics.jsonl line per step, with verl's metric names."""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlfleet.types import TrainSample
from controller.groups import ScoredGroup


# Why a generated group was not trained: generated under a version too old for this step (stale),
# fewer than two samples with a reward (unusable), all rewards equal under dynamic sampling (filtered).
DROP_REASONS = ("stale", "unusable", "filtered")


def _mean(values: list[float]) -> float:
    return math.fsum(values) / len(values) if values else 0.0


def step_metrics(step: int, train_version: int, groups: list[ScoredGroup], samples: list[TrainSample],
                 learner_metrics: dict[str, float], *, dropped: Mapping[str, int], wait_s: float,
                 train_s: float, sync_s: float, step_s: float) -> dict[str, Any]:
    # One pass over the batch's completions (they were three, and statistics.pstdev's exact fractions
    # cost ~2 us a group: issue 44); the std over an array
    rewards = [score for g in groups for _, score in g.scored()]
    lengths: list[int] = []
    truncated = 0
    for g in groups:
        for c in g.completions:
            lengths.append(c.response_tokens)
            truncated += c.finish_reason == "length"
    staleness = [train_version - g.version for g in groups]
    tokens = sum(len(s.prompt_ids) + s.response_tokens for s in samples)
    metrics: dict[str, Any] = {
        "step": step,
        "policy_version": train_version,
        "reward/mean": _mean(rewards),
        "reward/std": float(np.std(np.asarray(rewards, dtype=np.float64))) if len(rewards) > 1 else 0.0,
        "reward/max": max(rewards, default=0.0),
        "reward/min": min(rewards, default=0.0),
        "reward/failed": float(sum(g.failed for g in groups)),
        "response_length/mean": sum(lengths) / len(lengths) if lengths else 0.0,
        "response_length/max": float(max(lengths, default=0)),
        "response_length/clip_ratio": truncated / len(lengths) if lengths else 0.0,
        "staleness/mean": sum(staleness) / len(staleness) if staleness else 0.0,
        "staleness/max": float(max(staleness, default=0)),
        # Groups the staleness gate threw away (too old, or fewer than two rewards); by reason below.
        "staleness/dropped_groups": float(dropped.get("stale", 0) + dropped.get("unusable", 0)),
        **{f"dropped_groups/{reason}": float(dropped.get(reason, 0)) for reason in DROP_REASONS},
        "timing/gen_s": sum(g.gen_seconds for g in groups),
        "timing/reward_s": sum(g.reward_seconds for g in groups),
        "timing/wait_s": wait_s,
        "timing/train_s": train_s,
        "timing/weight_sync_s": sync_s,
        "timing/step_s": step_s,
        "perf/tokens_per_s": tokens / step_s if step_s > 0 else 0.0,
        "perf/samples_per_s": len(samples) / step_s if step_s > 0 else 0.0,
    }
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/pg_clipfrac", "actor/grad_norm",
                "actor/lr", "rollout/logprob_diff_mean"):
        metrics[key] = float(learner_metrics.get(key, 0.0))
    metrics.update({k: float(v) for k, v in learner_metrics.items() if k not in metrics})
    return metrics
