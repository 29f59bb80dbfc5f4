"""controller.data_plane=flight: a Train call whose payloads could not be fetched (issue 44).

The learner refuses such a step with FAILED_PRECONDITION naming the replica (rlfleet/dataplane/plane.py):
its groups' tokens went with it. The step's groups held there are re-queued (generated again
elsewhere), the others go back to the buffer, and the step takes a batch again. Pure: which groups.
"""
from __future__ import annotations

from controller.groups import ScoredGroup

def payload_addresses(group: ScoredGroup) -> set[str]:
    return {c.payload.address for c in group.completions if c.payload is not None}


def lost_groups(groups: list[ScoredGroup], error: BaseException) -> list[ScoredGroup]:
    """The groups whose payloads sit at a replica the learner's fetch error names; none if the error
    is not a data-plane fetch failure."""
    text = str(error)
    if "FAILED_PRECONDITION" not in text:
        return []
    named = {a for g in groups for a in payload_addresses(g) if a in text}
    return [g for g in groups if payload_addresses(g) & named]
