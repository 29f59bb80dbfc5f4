"""Generate and score a prompt set with any generate/score pair.

`generate(prompts, params)` and `score(items)` have the signatures of both the
in-process cores (`HFEngine.generate`, `RewardScorer.score`) and the service
clients (`RolloutClient.generate`, `RewardClient.score`), so `rlfleet eval` and
the controller's periodic validation share this code.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator

from rlfleet.data.prompts import Prompt
from rlfleet.env.toolcalls import malformed_tool_calls
from rlfleet.errors import RlfleetError
from rlfleet.eval.answers import answer_of
from rlfleet.eval.scoring import EvalSample
from rlfleet.types import (Completion, DataRow, GroupResult, PromptRequest, SamplingParams, ScoreItem,
                           ScoreResult)

GenerateFn = Callable[[list[PromptRequest], SamplingParams], Iterator[GroupResult]]
ScoreFn = Callable[[list[ScoreItem]], list[ScoreResult]]


def _score_group(prompt: Prompt, group: GroupResult, score: ScoreFn) -> list[EvalSample]:
    """Scores the final turn of each completion (the whole text of a single-turn one); an episode the
    environment rewarded keeps that reward, and one it failed has none."""
    items = [
        ScoreItem(
            id=f"{group.request_id}/{i}",
            data_source=prompt.data_source,
            prompt=prompt.text,
            response=c.final_text,
            ground_truth=prompt.ground_truth,
            extra_info=prompt.extra_info,
            finish_reason=c.finish_reason,
        )
        for i, c in enumerate(group.completions)
        if not c.failed and c.env_reward is None
    ]
    scored = iter(score(items) if items else [])
    results = [
        ScoreResult(f"{group.request_id}/{i}", 0.0, ok=False,
                    error=f"environment: {c.env_failure}: {c.env_error}")
        if c.failed
        else ScoreResult(f"{group.request_id}/{i}", float(c.env_reward))
        if c.env_reward is not None
        else next(scored)
        for i, c in enumerate(group.completions)
    ]
    return [
        EvalSample(
            prompt_index=prompt.index,
            data_source=prompt.data_source,
            sample=i,
            prompt=prompt.text,
            response=c.text,
            ground_truth=prompt.ground_truth,
            length=len(c.token_ids),
            finish_reason=c.finish_reason,
            policy_version=c.policy_version,
            reward=r.score if r.ok else None,
            error=r.error,
            turns=len(c.turns),
            tool_calls=sum(t.tool_calls for t in c.turns),
            tool_errors=sum(t.tool_errors for t in c.turns),
            answer=answer_of(c.final_text),
            nll=_nll(c),
            tool_format_errors=sum(malformed_tool_calls(t.text) for t in c.turns),
        )
        for i, (c, r) in enumerate(zip(group.completions, results))
    ]


def _nll(c: Completion) -> float | None:
    """Mean negative log-prob of the model's own tokens (an episode's observations left out); under
    sampling at temperature T an estimate of the entropy of that distribution, greedy the model's
    uncertainty about its argmax tokens. None when the engine returned no log-probs."""
    mask = c.loss_mask if c.loss_mask is not None else [1] * len(c.logprobs)
    own = [lp for lp, m in zip(c.logprobs, mask) if m]
    return -sum(own) / len(own) if own and len(c.logprobs) == len(c.token_ids) else None


def _row(p: Prompt) -> DataRow:
    return DataRow(data_source=p.data_source, prompt=p.text, ground_truth=p.ground_truth,
                   extra_info=p.extra_info)


def run_eval(
    prompts: list[Prompt],
    generate: GenerateFn,
    score: ScoreFn,
    params: SamplingParams,
    prompts_per_request: int = 32,
    progress: bool = False,
    episodes: bool = False,
) -> list[EvalSample]:
    """Every prompt's n samples, scored, in prompt order. `episodes`: each sample is an episode against
    the rollout's environment (the requests carry their data rows)."""
    from tqdm import tqdm

    samples: list[EvalSample] = []
    # A bar on a terminal; elsewhere (a log, a pipe) a line per request, as `run` and `sft` print steps.
    lines = progress and not sys.stderr.isatty()
    bar = tqdm(total=len(prompts), desc="eval", unit="prompt",
               disable=True if lines or not progress else None, leave=False)
    started = time.perf_counter()
    try:
        for start in range(0, len(prompts), prompts_per_request):
            chunk = {f"eval-{p.index}": p for p in prompts[start : start + prompts_per_request]}
            requests = [PromptRequest(rid, p.prompt_ids, row=_row(p) if episodes else None)
                        for rid, p in chunk.items()]
            seen: dict[str, GroupResult] = {}
            for group in generate(requests, params):
                if group.request_id not in chunk or group.request_id in seen:
                    raise RlfleetError(f"generation returned an unexpected group {group.request_id!r}")
                seen[group.request_id] = group
                bar.update(1)  # as each group arrives: the bar moves while a request generates
            # Scored once the stream has ended: a score that waits (a reward outage, waited out by
            # the controller) must not hold a Generate stream open until its deadline.
            for request_id, group in seen.items():
                samples.extend(_score_group(chunk[request_id], group, score))
            if lines:
                done = min(start + prompts_per_request, len(prompts))
                print(f"rlfleet: eval {done}/{len(prompts)} prompts ({time.perf_counter() - started:.0f}s)",
                      flush=True)
            if len(seen) != len(chunk):
                missing = sorted(set(chunk) - set(seen))[:3]
                raise RlfleetError(
                    f"generation returned {len(seen)} of {len(chunk)} groups (missing {missing})"
                )
    finally:
        bar.close()
    samples.sort(key=lambda s: (s.prompt_index, s.sample))
    return samples
