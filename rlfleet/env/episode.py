"""One episode's tokens, turn by turn: what the model generated (trained on) and what it was shown
(masked out), with each turn's policy versions.

Layout of the response (everything after the prompt), e.g. two turns:

    [opening obs] [turn 1: model] [obs 1] [turn 2: model]
    mask:   0 ...      1 ...         0 ...      1 ...
    logprob 0.0        sampled       0.0        sampled

The episode's `policy_version` is the oldest of its turns' versions (the staleness bound holds for
its oldest token), `last_policy_version` the newest. Pure: no tokenizer, no RPC.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from rlfleet.env.types import END_FAILED, END_LENGTH, END_MAX_TURNS, StepResult
from rlfleet.types import Completion, TurnRecord

# How an episode ends (Completion.finish_reason); the two the rollout stops are End's reasons too.
DONE, MAX_TURNS, TOKEN_BUDGET, FAILED = "stop", END_MAX_TURNS, END_LENGTH, END_FAILED


@dataclass
class Episode:
    episode_id: str
    prompt_ids: list[int]
    budget_tokens: int  # most response tokens (model + observations) the episode may hold
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)
    opening_tokens: int = 0
    env_reward: float | None = None
    finish_reason: str = ""  # "" while running; DONE, MAX_TURNS, TOKEN_BUDGET or FAILED once over
    failure: str = ""
    error: str = ""
    text_parts: list[str] = field(default_factory=list)
    prompt_trim: int = 0  # prompt tokens the context dropped (an opening observation replaced them)
    metric_sums: dict[str, float] = field(default_factory=dict)  # the environment's metrics, summed
    metric_counts: dict[str, int] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return bool(self.finish_reason)

    @property
    def context_ids(self) -> list[int]:
        """What the next turn is generated from."""
        return self.prompt_ids[:len(self.prompt_ids) - self.prompt_trim] + self.token_ids

    def record_metrics(self, metrics: dict[str, float]) -> None:
        """The environment's StepResult.metrics of one answer (Start, Step or End): averaged per name."""
        for name, value in metrics.items():
            self.metric_sums[name] = self.metric_sums.get(name, 0.0) + float(value)
            self.metric_counts[name] = self.metric_counts.get(name, 0) + 1

    @property
    def room(self) -> int:
        """Response tokens still allowed."""
        return self.budget_tokens - len(self.token_ids)

    def add_turn(self, ids: list[int], logprobs: list[float], version: int, last_version: int, text: str,
                 finish_reason: str, tool_calls: int = 0) -> None:
        """The model's turn: trained on (mask 1), with its sampling logprobs."""
        if len(ids) != len(logprobs):
            raise ValueError(f"episode {self.episode_id}: {len(logprobs)} logprobs for {len(ids)} tokens")
        self.token_ids += ids
        self.logprobs += logprobs
        self.loss_mask += [1] * len(ids)
        self.text_parts.append(text)
        self.turns.append(TurnRecord(generated_tokens=len(ids), observed_tokens=0, policy_version=version,
                                     last_policy_version=max(version, last_version), tool_calls=tool_calls,
                                     text=text, finish_reason=finish_reason))

    def add_observation(self, ids: list[int], text: str) -> None:
        """Tokens the model is shown (environment and chat template): context only (mask 0, logprob 0)."""
        self.token_ids += ids
        self.logprobs += [0.0] * len(ids)
        self.loss_mask += [0] * len(ids)
        self.text_parts.append(text)
        if not self.turns:
            self.opening_tokens += len(ids)
        else:
            last = self.turns[-1]
            self.turns[-1] = replace(last, observed_tokens=last.observed_tokens + len(ids),
                                     observation=last.observation + text)

    def record_answer(self, result: StepResult, latency_s: float) -> None:
        """The environment's answer to the last turn: its reward (the last one given is the episode's),
        tool errors and latency."""
        if result.reward is not None:
            self.env_reward = result.reward
        if self.turns:
            last = self.turns[-1]
            self.turns[-1] = replace(last, tool_errors=last.tool_errors + result.tool_errors,
                                     env_latency_s=last.env_latency_s + latency_s,
                                     reward=result.reward if result.reward is not None else last.reward)

    def finish(self, reason: str) -> None:
        if not self.finished:
            self.finish_reason = reason

    def fail(self, cause: str, error: str) -> None:
        self.failure, self.error = cause, error
        self.finish_reason = FAILED

    def completion(self) -> Completion:
        versions = [t.policy_version for t in self.turns] or [0]
        last_versions = [t.last_policy_version for t in self.turns] or [0]
        return Completion(token_ids=list(self.token_ids), logprobs=list(self.logprobs),
                          finish_reason=self.finish_reason or FAILED, policy_version=min(versions),
                          text="".join(self.text_parts), last_policy_version=max(last_versions),
                          loss_mask=list(self.loss_mask), turns=tuple(self.turns), env_reward=self.env_reward,
                          env_failure=self.failure, env_error=self.error, opening_tokens=self.opening_tokens,
                          prompt_trim=self.prompt_trim,
                          env_metrics={name: total / self.metric_counts[name]
                                       for name, total in self.metric_sums.items()})
