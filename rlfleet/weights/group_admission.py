"""Who may be in a weight group (rlfleet/weights/group.py), and ending one: with a token, every joining rank
proves it (HMAC of the host's nonce and its rank) and rank 0 publishes the verdict before any process group
is built; an abort (the learner's AbortWeightGroup) wakes every rank waiting in the rendezvous with a mark
that says why. Mixed into WeightGroup, whose state it uses.
"""
from __future__ import annotations

import hmac

import torch.distributed as dist

from rlfleet.errors import WeightSyncError
from rlfleet.weights.store import STORE_CONNECT_S, connect_store

_KEY_ROOT = "rlfleet/weights"
ABORTED = "aborted"  # the rendezvous key (and the mark on waiting ranks' keys) an abort leaves


def _proof(token: str, nonce: str, rank: int) -> str:
    return hmac.new(token.encode(), f"{nonce}:{rank}".encode(), "sha256").hexdigest()


class GroupAdmission:
    """Mixed into WeightGroup: token admission and the abort."""

    def abort(self, reason: str) -> None:
        """Ends this group from any thread (the learner's AbortWeightGroup, when the controller saw a
        member fail inside a sync): the operation in progress fails with WeightSyncError naming
        `reason` as soon as it looks (the rank wait at once, a gloo wait within ABORT_CHECK_S, an
        NCCL poll within 10 ms, its communicator then aborted), and every later one at once.

        What it cannot end: gloo building its process group (connecting to every peer) and a gloo
        broadcast's work itself, which runs on in gloo's thread until the operation's timeout (the
        caller stops waiting for it; the process group is released in a thread of its own)."""
        self._aborted = reason or "no reason given"
        if self.rank == 0:
            self._wake_rendezvous(self._aborted)

    def _wake_rendezvous(self, reason: str) -> None:
        """The ranks waiting in the rendezvous in progress (this rank's push among them; or the first
        one, when the members came before any push) wait for keys a dead rank never sets: set them all,
        with the mark that says why, so every wait returns and every rank fails at once (no rank polls).
        Over a connection of its own: the waiting thread holds its client's."""
        generation = self._connecting
        if generation is None:
            if self._used:
                return  # connected (or failed) before: nobody waits in a rendezvous of this group
            generation = 0
        try:
            store = dist.PrefixStore(f"{_KEY_ROOT}/g{generation}/",
                                     connect_store(self.address, STORE_CONNECT_S))
            store.set(ABORTED, reason)
            store.compare_set("auth/nonce", "", "")  # members that came before the push wait for it
            store.compare_set("auth/verdict", "", ABORTED)  # and those past the rank wait for this
            keys = [f"joined/{r}" for r in range(self.world_size)]
            store.multi_set(keys, [ABORTED] * len(keys))
        except Exception:
            pass  # the store is closed: nobody waits on it any more

    def _check_aborted(self, store: dist.Store | None = None) -> None:
        """WeightSyncError once the group was aborted: this rank's flag (where abort() ran), or the mark
        abort() left in the rendezvous `store` (the ranks it woke)."""
        reason = self._aborted
        if reason is None and store is not None:
            try:
                if store.check([ABORTED]):
                    reason = store.get(ABORTED).decode()
            except Exception as e:  # nothing can follow without the store
                self._broken = (f"the learner closed the weight group at {self.address} (an abort, a failed "
                                f"push or a newer group closes it): {e}")
                raise WeightSyncError(f"weight group rank {self.rank}: {self._broken}") from e
        if reason is not None:
            self._aborted = reason
            self._broken = (f"the push to the weight group at {self.address} was aborted: {reason}"
                            if self.rank == 0 else
                            f"the learner aborted the weight group at {self.address}: {reason}")
            raise WeightSyncError(f"weight group rank {self.rank}: {self._broken}")

    def _prove(self, store: dist.Store) -> None:
        """A joining rank: HMAC(token, nonce:rank) under auth/<rank>, when the host asks for one."""
        nonce = store.get("auth/nonce").decode()  # waits for the host, up to the store's timeout
        if nonce and self._token:
            store.set(f"auth/{self.rank}", _proof(self._token, nonce, self.rank))

    def _admit(self, store: dist.Store, generation: int) -> None:
        """Rank 0 checks every rank's proof and publishes the verdict; the others wait for it.
        No process group is built with a rank that did not present the token."""
        if self.rank == 0:
            nonce = store.get("auth/nonce").decode()
            refused = [r for r in range(1, self.world_size) if nonce and not (
                store.check([f"auth/{r}"]) and hmac.compare_digest(
                    store.get(f"auth/{r}").decode(), _proof(self._token or "", nonce, r)))]
            verdict = "refused " + ",".join(map(str, refused)) if refused else "ok"
            # not over an abort's verdict (abort() marks it only where none is set yet)
            if store.compare_set("auth/verdict", "", verdict).decode() != verdict:
                self._check_aborted(store)
            if refused:
                self._broken = (f"weight group generation {generation}: rank(s) {refused} did not present "
                                "the weight-group token; refused")
                raise WeightSyncError(self._broken)
            return
        try:
            verdict = store.get("auth/verdict").decode()
        except Exception as e:
            self._broken = (f"weight group generation {generation}: no admission verdict from the learner "
                            f"({e})")
            raise WeightSyncError(self._broken) from e
        if verdict == ABORTED:
            self._check_aborted(store)
        if verdict != "ok":
            self._broken = (f"weight group generation {generation}: the learner refused rank(s) "
                            f"{verdict.removeprefix('refused ')} (missing or wrong weight-group token)")
            raise WeightSyncError(self._broken)
