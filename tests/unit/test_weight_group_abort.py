"""A push waiting on a member that died inside the weight group ends when the controller aborts it
(issue 44, part C), not at the group's timeout.

The fleet simulator at N=256 with churn spent 22 s on 3 of 10 re-forms: a member died after the group
was opened, the learner's push waited its rank-connect wait (min(timeout, 20 s)) for it, and the
controller, which had seen that member's pull fail at once, waited for that push before the next open.
Here a real gloo group on the CPU: the learner's push waits for a rank that never comes (or, in a
connected group, for a receiver that never receives), Learner.abort_weight_group ends it, the push slot
is free and the group is gone; an abort of a group nobody pushes on is harmless.
"""
from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch

from rlfleet.config import LearnerConfig
from rlfleet.errors import WeightSyncError
from rlfleet.weights import WeightGroup, WeightReceiver
from rlfleet.weights.group import MEMBER_WAIT_S
from rlfleet.weights.store import connect_store

pytestmark = [pytest.mark.unit, pytest.mark.timeout(180)]

TIMEOUT_S = 60.0  # the group's timeout: the rank-connect wait is then MEMBER_WAIT_S (20 s)
# An aborted push ends within a few tenths of a second on a quiet machine; the bound leaves room for a
# loaded 2-core CI machine and is still half the rank-connect wait it replaces.
ENDS_WITHIN_S = MEMBER_WAIT_S / 2


@pytest.fixture(scope="module")
def learner(tiny_model_dir, tmp_path_factory):
    from services.learner.learner import Learner

    return Learner(LearnerConfig(lr=1e-3, weight_backend="gloo"), tiny_model_dir, torch.device("cpu"),
                   torch.float32, tmp_path_factory.mktemp("ckpt"), seed=0)


def _told_aborted(error: object) -> bool:
    """A member's pull ends with a WeightSyncError that says why: the abort's mark in the rendezvous, or
    (when the learner closed the aborted group first) its store gone."""
    return isinstance(error, WeightSyncError) and any(
        words in str(error) for words in ("aborted", "closed the weight group", "lost the weight store"))


def _in_thread(fn) -> tuple[threading.Thread, dict]:
    outcome: dict = {}

    def run() -> None:
        began = time.monotonic()
        try:
            outcome["result"] = fn()
        except Exception as exc:  # the test reads it
            outcome["error"] = exc
        outcome["ended"] = time.monotonic()
        outcome["took"] = outcome["ended"] - began
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def _wait_for_keys(address: str, keys: list[str]) -> None:
    """Until these rendezvous keys of generation 0 are set (the ranks reached the rank-connect wait)."""
    import torch.distributed as dist

    store = dist.PrefixStore("rlfleet/weights/g0/", connect_store(address, 10))
    store.wait(keys, timedelta(seconds=60))


def _member(address: str, rank: int, world_size: int) -> tuple[threading.Thread, dict]:
    """A rollout rank: joined (its JoinWeightGroup, here), then pulling in a thread."""
    group = WeightGroup.join(address, rank, world_size, timeout_s=TIMEOUT_S)

    def pull():
        try:
            with group.bounded():
                group.connect()
                return WeightReceiver(group).receive()
        finally:
            group.close()
    return _in_thread(pull)


def test_an_abort_ends_a_push_waiting_for_a_rank_that_never_comes(learner):
    address, backend = learner.open_weight_group(3, "127.0.0.1", TIMEOUT_S)  # the learner and 2 ranks
    assert backend == "gloo"
    member, member_out = _member(address, 1, 3)  # rank 2 died after the group was opened: never comes
    push, push_out = _in_thread(lambda: learner.push_weights(learner.version, group=address))
    _wait_for_keys(address, ["joined/0", "joined/1"])  # the push and rank 1 wait in the rendezvous
    aborted_at = time.monotonic()
    assert learner.abort_weight_group(address, "rank 2's pull failed (UNAVAILABLE)") is True
    push.join(60)
    member.join(60)
    assert not push.is_alive() and not member.is_alive()
    assert isinstance(push_out.get("error"), WeightSyncError), push_out
    assert "aborted" in str(push_out["error"]) and "rank 2's pull failed" in str(push_out["error"])
    assert push_out["ended"] - aborted_at < ENDS_WITHIN_S, f"the push ended {push_out['took']:.1f}s in"
    # the surviving member's pull ends too (its JoinWeightGroup for the next group would wait for it)
    assert _told_aborted(member_out.get("error")), member_out
    assert member_out["ended"] - aborted_at < ENDS_WITHIN_S, f"the pull ended {member_out['took']:.1f}s in"
    # the group is gone: a later push to it is refused at once, naming it
    with pytest.raises(WeightSyncError, match="no weight group at"):
        learner.push_weights(learner.version, group=address)
    # the push slot is free: the re-formed group (the survivor alone) is pushed to at once
    address2, _ = learner.open_weight_group(2, "127.0.0.1", TIMEOUT_S)
    member, member_out = _member(address2, 1, 2)
    stats = learner.push_weights(learner.version, group=address2)
    member.join(60)
    assert stats["bytes"] > 0 and member_out.get("result") is not None, member_out


def test_an_abort_ends_a_broadcast_waiting_for_a_receiver_on_gloo():
    """A connected group whose member no longer receives (it died inside the group, its machine gone
    without closing its sockets): the learner's broadcast waits on gloo; the abort ends the wait."""
    host = WeightGroup.host(2, timeout_s=TIMEOUT_S)
    member = WeightGroup.join(host.address, 1, 2, timeout_s=TIMEOUT_S)
    joined, _ = _in_thread(member.connect)
    host.connect()
    joined.join(60)
    # large enough that gloo's root waits for the receiver to take it (it does from a few MB)
    sending, out = _in_thread(lambda: host.broadcast(torch.zeros(16 << 20)))
    time.sleep(0.5)  # (the push is in flight, or done if gloo buffered it: the assertion below says)
    assert "error" not in out and sending.is_alive(), "gloo buffered the broadcast: nothing to abort"
    aborted_at = time.monotonic()
    host.abort("the member's pull failed")
    sending.join(60)
    assert isinstance(out.get("error"), WeightSyncError) and "aborted" in str(out["error"]), out
    assert out["ended"] - aborted_at < ENDS_WITHIN_S, f"the broadcast ended {out['took']:.1f}s in"
    member.close()
    host.close()


def test_an_abort_of_a_group_nobody_pushes_on_is_harmless(learner):
    assert learner.abort_weight_group("127.0.0.1:1", "stray") is False  # no group there: nothing happens
    active, _ = learner.open_weight_group(2, "127.0.0.1", TIMEOUT_S)
    member, out = _member(active, 1, 2)
    learner.push_weights(learner.version, group=active)
    member.join(60)
    idle, _ = learner.open_weight_group(2, "127.0.0.1", TIMEOUT_S)
    # the member joined the group but the push never came (the pull waits for the learner's rendezvous
    # nonce): whether it waits already or arrives after the abort, its pull ends at once
    began = time.monotonic()
    late, late_out = _member(idle, 1, 2)
    assert learner.abort_weight_group(idle, "its member failed") is False  # no push was on it
    late.join(60)
    assert _told_aborted(late_out.get("error")), late_out
    assert time.monotonic() - began < ENDS_WITHIN_S
    with pytest.raises(WeightSyncError, match="no weight group at"):  # a push after the abort: at once
        learner.push_weights(learner.version, group=idle)
    assert learner.weight_groups.find(active).address == active  # the group pushed to before is untouched
