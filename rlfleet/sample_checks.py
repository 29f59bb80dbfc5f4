"""Shape checks of a train sample that both the learner (before batching) and every service's request
validation (rlfleet.rpc.validate) apply. Torch-free, so the reward side can import the request checks
without pulling in torch."""
from __future__ import annotations

from typing import Protocol

from rlfleet.errors import InvalidRequest

__all__ = ["check_sample_shape"]


class SampleTokens(Protocol):
    """A TrainSample or its proto: what the shape check reads."""

    prompt_ids: list[int]
    response_ids: list[int]
    behaviour_logprobs: list[float]
    loss_mask: list[int] | None


def check_sample_shape(i: int, s: SampleTokens) -> None:
    """Token lists present and one behaviour logprob per response token (a TrainSample or its proto)."""
    if len(s.prompt_ids) == 0:  # len: the data plane hands the learner numpy views
        raise InvalidRequest(f"sample {i}: prompt_ids is empty")
    if len(s.response_ids) == 0:
        raise InvalidRequest(f"sample {i}: response_ids is empty")
    if len(s.behaviour_logprobs) != len(s.response_ids):
        raise InvalidRequest(f"sample {i}: {len(s.behaviour_logprobs)} behaviour_logprobs for "
                             f"{len(s.response_ids)} response tokens")
    mask = s.loss_mask
    if mask:  # None or empty: every response token is trained on
        if len(mask) != len(s.response_ids):
            raise InvalidRequest(f"sample {i}: {len(mask)} loss_mask entries for {len(s.response_ids)} "
                                 "response tokens")
        if any(m not in (0, 1) for m in mask):
            raise InvalidRequest(f"sample {i}: loss_mask entries must be 0 or 1")
