"""What every rollout backend implements. The servicer and the weight sync only see this."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator

import torch

from rlfleet.types import GroupResult, PromptRequest, SamplingParams


class RolloutEngine(ABC):
    """Samples groups of completions and swaps in new weights atomically.

    `policy_version` is the version of the weights currently served; every
    Completion carries the version that produced it.
    """

    policy_version: int = 0

    @abstractmethod
    def generate(self, prompts: list[PromptRequest], params: SamplingParams) -> Iterator[GroupResult]:
        """Yields one GroupResult per prompt (in any order) as soon as it is complete."""

    @abstractmethod
    def apply_weights(self, tensors: dict[str, torch.Tensor], version: int) -> None:
        """Replaces the served weights; no generation step may see a mix of versions."""

    @abstractmethod
    def weights_digest(self) -> str:
        """rlfleet.weights.digest of the weights served now."""

    @property
    @abstractmethod
    def device(self) -> torch.device:
        """Where weight buffers should be received."""
