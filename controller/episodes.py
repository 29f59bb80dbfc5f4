"""Multi-turn episodes in the controller: which completions the reward service scores, the metrics
of a step's episodes, and each turn as the samples dump shows it.

An episode's reward is the environment's when it gave one; an episode without one (a tool
environment) is scored by the reward service on the model's final turn, as a single-turn response
is; a failed episode gets no reward at all (left out of training and counted under its cause in
`env/failed/<cause>`, never scored 0).
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

from controller.groups import group_score_item, item_id, prompt_item_fields
from rlfleet.env.toolcalls import malformed_tool_calls
from rlfleet.data.prompts import Prompt
from rlfleet.env.types import FAILURE_CAUSES, UNAVAILABLE
from rlfleet.types import Completion, ScoreItem, ScoreResult


def split_group(prompt: Prompt, completions: list[Completion],
                request_id: str) -> tuple[list[ScoreResult | None], list[ScoreItem]]:
    """The results an episode already has (the environment's reward, or its failure), None where the
    reward service must score, and the items to send it (groups.score_items', whatever a reward is
    told of a single-turn response, with the final turn as the response)."""
    results: list[ScoreResult | None] = []
    to_score: list[ScoreItem] = []
    shared = prompt_item_fields(prompt)  # once a group, not an item (issue 44)
    for i, c in enumerate(completions):
        if c.failed:
            results.append(ScoreResult(item_id(request_id, i), 0.0, ok=False,
                                       error=f"environment: {c.env_failure}: {c.env_error}"))
        elif c.env_reward is not None:
            results.append(ScoreResult(item_id(request_id, i), float(c.env_reward)))
        else:
            results.append(None)
            to_score.append(group_score_item(shared, item_id(request_id, i), c.final_text, c.finish_reason))
    return results, to_score


def score_group(prompt: Prompt, completions: list[Completion], request_id: str,
                score: Callable[[list[ScoreItem]], list[ScoreResult]]) -> list[ScoreResult]:
    """One result per completion, in order; `score` (the reward service) is called only for those
    that need it, and not at all when none does."""
    results, to_score = split_group(prompt, completions, request_id)
    scored = iter(score(to_score) if to_score else [])
    return [r if r is not None else next(scored) for r in results]


def env_unavailable(completions: list[Completion]) -> str | None:
    """The error of an episode that failed because the environment could not be reached, if any."""
    for c in completions:
        if c.env_failure == UNAVAILABLE:
            return c.env_error
    return None


def env_metrics(completions: list[Completion]) -> dict[str, float]:
    """env/… metrics of a step's episodes (an empty dict when none was multi-turn)."""
    episodes = [c for c in completions if c.turns or c.failed]
    if not episodes:
        return {}
    turns = [t for c in episodes for t in c.turns]
    failed = Counter(c.env_failure for c in episodes if c.failed)
    generated = sum(sum(c.loss_mask) if c.loss_mask else len(c.token_ids) for c in episodes)
    observed = sum(len(c.token_ids) for c in episodes) - generated
    n = len(episodes)
    metrics = {
        "env/episodes": float(n),
        "env/turns_mean": len(turns) / n,
        "env/turns_max": float(max((len(c.turns) for c in episodes), default=0)),
        "env/tool_calls": float(sum(t.tool_calls for t in turns)),
        "env/tool_calls_per_episode": sum(t.tool_calls for t in turns) / n,
        "env/tool_errors": float(sum(t.tool_errors for t in turns)),
        # tool-call openings never closed (`</tool_calll`): the environment saw a final answer
        "env/tool_format_errors": float(sum(malformed_tool_calls(t.text) for t in turns)),
        "env/latency_s_mean": sum(t.env_latency_s for t in turns) / len(turns) if turns else 0.0,
        "env/generated_tokens": float(generated),
        "env/observed_tokens": float(observed),
        "env/with_env_reward": float(sum(c.env_reward is not None for c in episodes)),
        "env/failed": float(sum(failed.values())),
    }
    for cause in FAILURE_CAUSES:
        metrics[f"env/failed/{cause}"] = float(failed.get(cause, 0))
    for reason in ("stop", "max_turns", "length"):
        metrics[f"env/finish/{reason}"] = float(sum(c.finish_reason == reason for c in episodes))
    metrics.update(reported_metrics(episodes, reserved=set(metrics)))
    return metrics


def reported_metrics(episodes: list[Completion], reserved: set[str]) -> dict[str, float]:
    """The environment's own metrics (StepResult.metrics): `env/<name>`, the mean over the episodes that
    reported the name of each episode's mean; a name rlfleet's own env/ metrics use (`episodes`,
    `failed`, …) becomes `env/reported/<name>`."""
    values: dict[str, list[float]] = {}
    for c in episodes:
        for name, value in c.env_metrics.items():
            if math.isfinite(value):  # a NaN would poison the mean (and is no number to chart)
                values.setdefault(name, []).append(value)
    out = {}
    for name, vs in sorted(values.items()):
        key = f"env/{name}"
        out[key if key not in reserved else f"env/reported/{name}"] = sum(vs) / len(vs)
    return out


def turn_records(c: Completion) -> list[dict]:
    """The episode turn by turn, for samples/train.jsonl."""
    return [{"turn": i + 1, "text": t.text, "observation": t.observation,
             "generated_tokens": t.generated_tokens, "observed_tokens": t.observed_tokens,
             "version": t.policy_version,
             "last_version": t.last_policy_version, "tool_calls": t.tool_calls, "tool_errors": t.tool_errors,
             "env_latency_s": round(t.env_latency_s, 4), "reward": t.reward,
             "finish_reason": t.finish_reason}
            for i, t in enumerate(c.turns)]
