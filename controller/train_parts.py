"""A step's Train request from its groups' prepared parts (issue 44).

Each group's samples, and their bytes in the Train request, are made when the group is scored and
buffered (on the event loop, spread over the step: prepare_for_training); the step's request then only
joins them. Made all at once at the step's start, B x n samples of Python held the GIL against the
event loop just as the batch's last streams ended and their members waited to be admitted again.
"""
from __future__ import annotations

from dataclasses import dataclass

from controller.groups import ScoredGroup
from controller.sample_builder import SampleBuilder
from rlfleet.rpc import convert
from rlfleet.types import TrainBatch


@dataclass(frozen=True)
class EncodedTrainBatch(TrainBatch):
    """A TrainBatch with its samples' request bytes, a part per group in order
    (convert.train_request_wire joins them into the request train_batch_to_proto would serialize)."""

    sample_wire: tuple[bytes, ...] = ()


def prepare_for_training(builder: SampleBuilder, group: ScoredGroup) -> None:
    """Makes the group's samples and (if dynamic sampling keeps it) their request bytes, ahead of its step.
    A group that cannot be trained (fewer than two rewards) is left alone, as is one whose advantages
    fail: the step builds it again and its error stops the run there, as before."""
    if len(group.scored()) < 2:
        return
    try:
        part = builder.group_samples(group)
    except Exception:  # noqa: BLE001 - raised again where the step builds it (SampleBuilder.build)
        group.prepared = None
        return
    if builder.keep(group):
        part.wire = convert.train_samples_wire(part.samples)


def assemble_batch(builder: SampleBuilder, step: int, groups: list[ScoredGroup], temperature: float,
                   expected_version: int) -> tuple[EncodedTrainBatch, dict[str, float]]:
    """The step's batch and its sample metrics, from its groups' parts (any not made yet are made now)."""
    samples, metrics = builder.build(groups)
    parts = []
    for g in groups:
        part = builder.group_samples(g)
        if part.wire is None:
            part.wire = convert.train_samples_wire(part.samples)
        parts.append(part.wire)
    return EncodedTrainBatch(step=step, samples=samples, temperature=temperature,
                             expected_version=expected_version, sample_wire=tuple(parts)), metrics
