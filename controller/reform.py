"""Who the re-formed weight group takes when members fail during the re-form (pure; issue 34).

A re-form asks every member at once (WeightSync.open, .sync): its status, then JoinWeightGroup with
its ranks, then the pull. torch.distributed builds a group only when every rank of the world size
handed out arrives, so a member that fails after ranks were handed out makes the whole group
unbuildable: the re-form then starts again over the survivors, with ranks handed out afresh. What
happens to the members that failed depends on how they came: one that joined while the run went on
leaves the run (its groups are re-queued as for any leave); one the run started with is waited for
(`rlfleet run` restarts it), as everywhere else (controller/fleet.py).
"""
from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from rlfleet.errors import Busy, RlfleetError, ServiceUnavailable, WeightSyncError

M = TypeVar("M", bound=Hashable)


class MembersFailed(WeightSyncError):
    """Rollout members failed during a re-form or a sync (dead, unreachable, or refused): `failures`
    maps each one (its client) to its error. The group cannot be built with them."""

    def __init__(self, stage: str, failures: Mapping[object, BaseException]):
        self.stage, self.failures = stage, dict(failures)
        first = next(iter(self.failures.values()))
        more = f" (and {len(self.failures) - 1} more member(s))" if len(self.failures) > 1 else ""
        super().__init__(f"{first}{more}")


def member_failed(exc: BaseException) -> bool:
    """Whether a rollout call's error says the member itself failed: unreachable (dead, frozen past
    the call's deadline, its channel closed) or refusing for good. Busy (another pull or join runs
    there) and WeightSyncError (the group broke: any rank's doing) say nothing about the member."""
    if isinstance(exc, ServiceUnavailable):
        return True
    return isinstance(exc, RlfleetError) and not isinstance(exc, (Busy, WeightSyncError))


def seats(ranks: Sequence[int]) -> tuple[int, list[int]]:
    """The world size and each member's first rank, for members taking `ranks` ranks each (one per
    tensor-parallel worker); rank 0 is the learner."""
    firsts, base = [], 1
    for count in ranks:
        firsts.append(base)
        base += count
    return base, firsts


@dataclass(frozen=True)
class NextGroup(Generic[M]):
    survivors: list[M]  # did not fail: the next try is formed over them (once nobody is waited for)
    leaving: list[M]  # failed and joined while the run went on: out of the run
    waited: list[M]  # failed and started with the run: no group without them until they are back


def next_group(members: Sequence[M], failed: Mapping[M, BaseException] | set[M],
               joined: Callable[[M], bool]) -> NextGroup[M]:
    """Splits `members` after a try in which `failed` failed, keeping their order."""
    return NextGroup([m for m in members if m not in failed],
                     [m for m in members if m in failed and joined(m)],
                     [m for m in members if m in failed and not joined(m)])
