"""What the algorithm does in the controller: reward shaping, dynamic sampling, group advantages.

* Overlong shaping (DAPO's soft overlong punishment; for a multi-turn episode, of its final turn):
  with ``L`` = rollout.max_new_tokens and a buffer of ``c = overlong_buffer_ratio * L`` tokens,
  a response of length ``l`` gets ``0`` if ``l <= L - c``, ``-penalty * (l - (L - c)) / c``
  inside the buffer, and ``-penalty`` at ``L`` (a truncated response). Added to the reward
  before advantages.
* Dynamic sampling (DAPO): a group whose (shaped) rewards are all equal has zero advantage
  everywhere and only dilutes the batch; the loop drops it and generates more.
* Advantages: the registered group estimator, over the shaped rewards. `groups/no_signal` counts
  the groups whose shaped rewards were all equal (zero advantages: nothing learned from them).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from controller.groups import ScoredGroup
from rlfleet.advantages import ADVANTAGE_ESTIMATORS
from rlfleet.algorithm import AlgorithmConfig
from rlfleet.types import Completion, TrainSample


def overlong_penalty(length: int, max_tokens: int, buffer_tokens: float, penalty: float) -> float:
    """DAPO's soft overlong punishment (<= 0); a zero-width buffer disables it."""
    if buffer_tokens <= 0:
        return 0.0
    start = max_tokens - buffer_tokens
    if length <= start:
        return 0.0
    return -penalty * min(length - start, buffer_tokens) / buffer_tokens


def shaped_length(c: Completion) -> int:
    """The length the overlong penalty judges: the response, or for a multi-turn episode its final turn
    (rollout.max_new_tokens bounds one turn; observations are not the model's length)."""
    return c.turns[-1].generated_tokens if c.turns else c.response_tokens


@dataclass
class GroupSamples:
    """A group's part of a step: its samples (advantages are group-local) and what the step's metrics
    take from it. Made once a group, when it is buffered (controller/train_parts.prepare_for_training, on
    the event loop), so a step's batch only joins its groups' parts (issue 44)."""

    made_by: SampleBuilder  # whose shaping and estimator made it: another builder makes its own
    samples: list[TrainSample]
    rewards: list[float]  # shaped, one per scored completion
    penalties: list[float]  # the overlong penalty in each of `rewards`; empty without shaping
    wire: bytes | None = None  # the samples as the Train request carries them (convert.train_samples_wire)


class SampleBuilder:
    def __init__(self, algo: AlgorithmConfig, max_new_tokens: int) -> None:
        self.algo = algo
        self.max_new_tokens = max_new_tokens
        self.buffer_tokens = algo.overlong_buffer_ratio * max_new_tokens
        estimator = ADVANTAGE_ESTIMATORS.get(algo.advantage)
        self.estimator = estimator.group_advantages
        # A group of equal rewards has no signal only where the advantage is the group's alone (not
        # for a learner-side stage: a critic, or a batch-wide normalisation)
        self.group_only = estimator.group is not None and estimator.token is None

    def shaped_rewards(self, group: ScoredGroup) -> list[float]:
        """One reward per scored completion: the score plus the overlong penalty (none without a buffer:
        the call is left out, the sum kept, so a -0.0 score is 0.0 either way)."""
        if self.buffer_tokens <= 0:
            return [score + 0.0 for _, score in group.scored()]
        return [score + overlong_penalty(shaped_length(c), self.max_new_tokens, self.buffer_tokens,
                                         self.algo.overlong_penalty)
                for c, score in group.scored()]

    def keep(self, group: ScoredGroup) -> bool:
        """False for a group dynamic sampling drops: its rewards carry no signal."""
        if not self.algo.dynamic_sampling:
            return True
        part = group.prepared
        rewards = part.rewards if part is not None and part.made_by is self else self.shaped_rewards(group)
        return any(r != rewards[0] for r in rewards)

    def filter_limit(self, batch_groups: int) -> int | None:
        """Groups dynamic sampling may drop in one step before giving up (verl's
        max_num_gen_batches, in batches of `batch_groups`); None: no limit."""
        return None if self.algo.max_gen_batches == 0 else self.algo.max_gen_batches * batch_groups

    def group_samples(self, g: ScoredGroup) -> GroupSamples:
        """The group's samples, shaped rewards and penalties: made on the first call, kept on the group
        (its rewards never change once scored, nor this builder's settings)."""
        if g.prepared is None or g.prepared.made_by is not self:
            rewards = self.shaped_rewards(g)
            penalties = ([r - score for r, (_, score) in zip(rewards, g.scored())]
                         if self.buffer_tokens > 0 else [])
            g.prepared = GroupSamples(self, g.train_samples(self.estimator, rewards), rewards, penalties)
        return g.prepared

    def build(self, groups: list[ScoredGroup]) -> tuple[list[TrainSample], dict[str, float]]:
        """The batch's samples and their metrics, from each group's part (each made once)."""
        samples: list[TrainSample] = []
        penalties: list[float] = []
        flat = 0  # groups whose (shaped) rewards are all equal: zero advantages, nothing to learn
        for g in groups:
            part = self.group_samples(g)
            samples += part.samples
            penalties += part.penalties
            rewards = part.rewards
            flat += all(r == rewards[0] for r in rewards)
        # math.fsum / n: what statistics.fmean computes, without its generic checks
        shaped_mean = math.fsum(s.reward for s in samples) / len(samples) if samples else 0.0
        metrics = {"reward/shaped_mean": shaped_mean,
                   "groups/trained": float(len(groups))}
        if self.group_only:
            metrics["groups/no_signal"] = float(flat)
        if self.buffer_tokens > 0:
            metrics["reward/overlong_penalty_mean"] = (math.fsum(penalties) / len(penalties)
                                                       if penalties else 0.0)
        return samples, metrics
