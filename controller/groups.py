"""Scored groups: what the controller buffers between generation and training."""
from __future__ import annotations

from dataclasses import dataclass, field

from rlfleet.data.prompts import Prompt
from rlfleet.types import Completion, ScoreItem, ScoreResult, TrainSample
from controller.advantages import group_advantages


@dataclass
class ScoredGroup:
    seq: int  # admission order
    prompt: Prompt
    completions: list[Completion]
    results: list[ScoreResult]
    gen_seconds: float = 0.0
    reward_seconds: float = 0.0
    failed: int = field(init=False)

    def __post_init__(self) -> None:
        self.failed = sum(not r.ok for r in self.results)

    @property
    def version(self) -> int:
        """The oldest policy version that produced any of its completions."""
        return min(c.policy_version for c in self.completions)

    def scored(self) -> list[tuple[Completion, float]]:
        """Completions with an obtained reward; failures are excluded, never scored 0."""
        return [(c, r.score) for c, r in zip(self.completions, self.results) if r.ok]

    def train_samples(self) -> list[TrainSample]:
        kept = self.scored()
        advantages = group_advantages([score for _, score in kept]).tolist() if kept else []
        return [TrainSample(prompt_ids=self.prompt.prompt_ids, response_ids=c.token_ids,
                            behaviour_logprobs=c.logprobs, advantage=float(a),
                            generation_version=c.policy_version)
                for (c, _), a in zip(kept, advantages) if c.token_ids]


def score_items(prompt: Prompt, completions: list[Completion], request_id: str) -> list[ScoreItem]:
    return [ScoreItem(id=f"{request_id}/{i}", data_source=prompt.data_source, prompt=prompt.text,
                      response=c.text, ground_truth=prompt.ground_truth, extra_info=prompt.extra_info)
            for i, c in enumerate(completions)]
