"""Scored groups: what the controller buffers between generation and training."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from rlfleet.advantages.group_lists import group_advantages
from rlfleet.data.prompts import Prompt
from rlfleet.types import Completion, ScoreItem, ScoreResult, TrainSample

if TYPE_CHECKING:
    from controller.sample_builder import GroupSamples

_new = object.__new__


@dataclass
class ScoredGroup:
    seq: int  # admission order
    prompt: Prompt
    completions: list[Completion]
    results: list[ScoreResult]
    gen_seconds: float = 0.0
    reward_seconds: float = 0.0
    replica: str = ""  # address of the rollout replica that generated it
    failed: int = field(init=False)
    # Worked out once: the loop asks for them several times a group (buffer, batch, samples, metrics)
    _version: int | None = field(default=None, init=False, repr=False, compare=False)
    _scored: list[tuple[Completion, float]] = field(init=False, repr=False, compare=False)
    # Its samples for training, made once it is scored (SampleBuilder.group_samples), not at the step
    prepared: GroupSamples | None = field(default=None, init=False, repr=False, compare=False)
    # Its samples/train.jsonl records as JSON pieces, made once it is scored (controller/sample_lines.py)
    record_pieces: list[tuple[bytes, bytes]] | None = field(default=None, init=False, repr=False,
                                                            compare=False)

    def __post_init__(self) -> None:
        self.failed = sum(not r.ok for r in self.results)
        self._scored = [(c, r.score) for c, r in zip(self.completions, self.results) if r.ok]

    @property
    def version(self) -> int:
        """The oldest policy version that produced any of its completions."""
        if self._version is None:
            self._version = min(c.policy_version for c in self.completions)
        return self._version

    def scored(self) -> list[tuple[Completion, float]]:
        """Completions with an obtained reward; failures are excluded, never scored 0. The same list
        every call: not to be changed."""
        return self._scored

    def train_samples(self, estimator: Callable[[list[float]], list[float]] | None = None,
                      rewards: list[float] | None = None) -> list[TrainSample]:
        """Samples with advantages from `estimator` (default GRPO's) over `rewards` (default: the
        scores of `scored()`; pass shaped rewards, one per scored completion, to train on those)."""
        kept = self.scored()
        rewards = [score for _, score in kept] if rewards is None else rewards
        if len(rewards) != len(kept):
            raise ValueError(f"{len(rewards)} rewards for {len(kept)} scored completions")
        advantages = (estimator(rewards) if estimator else group_advantages(rewards)) if kept else []
        prompt_ids = self.prompt.prompt_ids
        samples = []
        for (c, _), a, r in zip(kept, advantages, rewards):
            if not c.response_tokens:
                continue
            # Made without the frozen __init__ and without assemble's field check (issue 44: ~0.4 us
            # of a sample's ~1.2); tests/unit/test_groups_and_metrics.py checks every field is set.
            sample = _new(TrainSample)
            sample.__dict__.update({
                "prompt_ids": context_prompt(prompt_ids, c) if c.prompt_trim else prompt_ids,
                "response_ids": c.token_ids, "behaviour_logprobs": c.logprobs, "advantage": float(a),
                "generation_version": c.policy_version, "reward": float(r), "loss_mask": c.loss_mask,
                "payload": c.payload})
            samples.append(sample)
        return samples


def context_prompt(prompt_ids: list[int], c: Completion) -> list[int]:
    """The prompt tokens the completion follows: all of them, less the episode's trim (an opening
    observation replaced the generation prompt)."""
    return prompt_ids[:len(prompt_ids) - c.prompt_trim] if c.prompt_trim else prompt_ids


def score_items(prompt: Prompt, completions: list[Completion], request_id: str) -> list[ScoreItem]:
    return [score_item(prompt, c, item_id(request_id, i)) for i, c in enumerate(completions)]


def item_id(request_id: str, index: int) -> str:
    """A completion's id in a Score request: its group's request id and its index in the group."""
    return f"{request_id}/{index}"


def score_item(prompt: Prompt, c: Completion, item: str, response: str | None = None) -> ScoreItem:
    """What the reward service is told of `c`: its text, or `response` (an episode's final turn)."""
    return group_score_item(prompt_item_fields(prompt), item, c.text if response is None else response,
                            c.finish_reason)


def prompt_item_fields(prompt: Prompt) -> dict[str, Any]:
    """The fields a group's ScoreItems share (its prompt's), made once a group."""
    return {"data_source": prompt.data_source, "prompt": prompt.text, "ground_truth": prompt.ground_truth,
            "extra_info": prompt.extra_info}


def group_score_item(shared: dict[str, Any], item: str, response: str, finish_reason: str) -> ScoreItem:
    """A ScoreItem from its group's `shared` fields (prompt_item_fields) and its own, made without the
    frozen __init__ (issue 44: one an item, on the scoring threads' hot path: ~1.3 -> ~0.6 us an item
    with split_group). Every field is set: _ITEM_FIELDS is checked against ScoreItem's at import."""
    obj = object.__new__(ScoreItem)
    obj.__dict__.update(shared, id=item, response=response, finish_reason=finish_reason)
    return obj


_ITEM_FIELDS = {"data_source", "prompt", "ground_truth", "extra_info", "id", "response", "finish_reason"}
if {f.name for f in fields(ScoreItem)} != _ITEM_FIELDS:  # a field added to ScoreItem must be set above
    raise ImportError(f"controller.groups.group_score_item sets {sorted(_ITEM_FIELDS)}, ScoreItem has "
                      f"{sorted(f.name for f in fields(ScoreItem))}")
