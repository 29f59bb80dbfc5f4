"""What every rollout backend implements. The servicer only sees this."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator

from rlfleet.errors import InvalidRequest, RequestTooLarge
from rlfleet.types import GroupResult, PromptRequest, SamplingParams


def check_prompts(prompts: list[PromptRequest], params: SamplingParams, vocab_size: int, max_len: int,
                  limit_name: str) -> None:
    """The checks every backend makes before generating: prompts present and non-empty, token ids
    in the vocabulary, prompt + new tokens within the context limit (`limit_name` names it)."""
    if not prompts:
        raise InvalidRequest("generate request has no prompts")
    if params.max_new_tokens < 1:
        raise InvalidRequest("max_new_tokens must be at least 1")
    for p in prompts:
        if not p.prompt_ids:
            raise InvalidRequest(f"prompt {p.request_id!r} has no tokens")
        if min(p.prompt_ids) < 0 or max(p.prompt_ids) >= vocab_size:
            raise InvalidRequest(f"prompt {p.request_id!r} has token ids outside [0, {vocab_size})")
        if len(p.prompt_ids) + params.max_new_tokens > max_len:
            raise RequestTooLarge(f"prompt {p.request_id!r}: {len(p.prompt_ids)} tokens + "
                                  f"{params.max_new_tokens} new exceed {limit_name} {max_len}")


class RolloutEngine(ABC):
    """Samples groups of completions and takes new weights from the learner's weight group.

    `policy_version` is the version of the weights served now; every Completion
    carries the versions that produced it.
    """

    policy_version: int = 0
    #: ranks this engine occupies in the weight group (one per tensor-parallel worker)
    weight_ranks: int = 1

    @abstractmethod
    def generate(self, prompts: list[PromptRequest], params: SamplingParams) -> Iterator[GroupResult]:
        """Yields one GroupResult per prompt (in any order) as soon as it is complete."""

    @abstractmethod
    def join_weight_group(self, address: str, rank: int, world_size: int, backend: str, timeout_s: float,
                          token: str | None = None) -> None:
        """Joins the learner's weight group with ranks `rank .. rank + weight_ranks - 1`, proving `token`."""

    @abstractmethod
    def pull_weights(self, version: int) -> dict[str, float]:
        """Receives one broadcast and swaps it in; no generation step sees a mix of versions.
        Returns `version`, `bytes` and `seconds`."""

    def placement(self) -> str:
        """Where this engine's weights live (rlfleet.devices.placement), so that the learner can pick
        the weight transport; "" when unknown (the learner then decides by its own host)."""
        return ""

    def weights_digest(self) -> str:
        """rlfleet.weights.digest of the served weights in the learner's naming, or "" if the
        backend stores them differently (e.g. vLLM's fused layers)."""
        return ""

    def close(self) -> None:
        """Releases the engine's resources."""
