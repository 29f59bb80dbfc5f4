"""A private broadcast group between the learner (rank 0) and rollout workers.

Why its own group: the learner may itself run under torchrun with a default
process group, and rollout workers come and go. So this group never touches
``torch.distributed``'s global state: the learner hosts its own ``TCPStore``,
and the backend object (``ProcessGroupGloo`` / ``ProcessGroupNCCL``) is built
directly on a ``PrefixStore`` keyed by a *generation*, so a broken group can be
rebuilt later on the same store under a fresh prefix.

Why ``host()``/``join()`` don't block: the learner must hand its address to the
workers (over gRPC) before anyone can rendezvous. Only ``connect()`` waits for
all ranks, with the timeout, and names the ranks that never showed up.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import secrets
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from rlfleet.errors import InvalidRequest, WeightSyncError  # InvalidRequest is a ValueError
from rlfleet.weights.store import (  # noqa: F401 - probe_store, STORE_CONNECT_S: this module's API too
    STORE_CONNECT_S,
    connect_store,
    listen_socket,
    local_address_towards,
    probe_store,
)
from rlfleet.weights.group_admission import _KEY_ROOT, GroupAdmission
from rlfleet.weights.sealed_store import SealedStore, check_channels, check_members, round_secret

_PROTOCOL = 2  # bumped when the wire format (header/manifest/buckets) changes; 2: header + layout on change
# A member that has not reached the rendezvous by then is not coming: the controller starts every
# pull together with the push. Bounded apart from the group's timeout (which covers the transfer
# of a large model), so a push waiting for a rank that never joins ends in seconds (issue 22).
MEMBER_WAIT_S = 20.0
# A gloo wait in progress looks at the abort flag (abort()) this often; a wait that ends sooner returns
# at once, so it costs nothing to a broadcast that completes.
ABORT_CHECK_S = 0.1
# An aborted group's store outlives close() by this much, so the ranks it woke read why (its mark)
# rather than a closed connection (which torch also logs as a warning with a C++ stack on every rank).
ABORT_LINGER_S = 2.0


class WeightGroup(GroupAdmission):
    """One rank of the weight-broadcast group; rank 0 is always the sender."""

    def __init__(self, store: dist.Store, rank: int, world_size: int, backend: str,
                 timeout_s: float, device: torch.device | str | None, address: str,
                 token: str | None = None) -> None:
        if backend not in ("gloo", "nccl"):
            raise InvalidRequest(f"backend must be 'gloo' or 'nccl', got {backend!r}")
        if world_size < 2 or not 0 <= rank < world_size:
            raise InvalidRequest(f"need world_size >= 2 and 0 <= rank < world_size, got {rank}/{world_size}")
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else "cpu"
        self.device = torch.device(device)
        if backend == "nccl" and self.device.type != "cuda":
            raise InvalidRequest(f"nccl needs a CUDA device, got {self.device}")
        self.rank, self.world_size, self.backend = rank, world_size, backend
        self.timeout_s, self.address = float(timeout_s), address
        self._store: dist.Store | None = store
        self._pg: dist.ProcessGroup | None = None
        self._generation = -1
        self._used: set[int] = set()  # a prefix's rendezvous keys are never reset, so never reuse one
        self._broken: str | None = None
        self._token = token or None  # admits ranks: see _admit()
        self._deadline: float | None = None  # the end of the operation in progress (bounded())
        self._aborted: str | None = None  # why abort() ended this group (then every operation fails)
        self._connecting: int | None = None  # the generation whose rendezvous is in progress
        # What the sender and receivers remember between pushes (the last layout sent). It lives
        # here, not in WeightSender/WeightReceiver, because it is only valid for the ranks that saw
        # the same broadcasts: it is cleared whenever the process group is dropped or rebuilt, on
        # every rank alike, so a rebuilt group always starts with the full layout again.
        self.cache: dict[str, object] = {}

    @classmethod
    def host(cls, world_size: int, backend: str = "gloo", host: str = "127.0.0.1", port: int = 0,
             timeout_s: float = 60, device: torch.device | str | None = None,
             token: str | None = None) -> WeightGroup:
        """Rank 0: start the TCPStore (port 0 = OS-assigned) and return at once.

        With `token`, connect() admits only ranks that prove they hold the same token."""
        # TCPStore binds every interface when it opens the port itself; hand it a socket bound
        # to `host` only, the address that is announced to the ranks.
        store = dist.TCPStore(host, port, None, True, timedelta(seconds=timeout_s),
                              wait_for_workers=False, master_listen_fd=listen_socket(host, port))
        addr = f"[{host}]:{store.port}" if ":" in host else f"{host}:{store.port}"
        return cls(store, 0, world_size, backend, timeout_s, device, addr, token)

    @classmethod
    def join(cls, address: str, rank: int, world_size: int, backend: str = "gloo",
             timeout_s: float = 60, device: torch.device | str | None = None,
             token: str | None = None) -> WeightGroup:
        """Ranks 1..N: connect to the learner's store (within STORE_CONNECT_S; `timeout_s` then bounds
        every later wait on it)."""
        if rank == 0:
            raise InvalidRequest("rank 0 is the learner; it calls WeightGroup.host()")
        store = connect_store(address, min(timeout_s, STORE_CONNECT_S))
        store.set_timeout(timedelta(seconds=timeout_s))
        return cls(store, rank, world_size, backend, timeout_s, device, address, token)

    @property
    def member_wait_s(self) -> float:
        return min(self.timeout_s, MEMBER_WAIT_S)

    @contextmanager
    def bounded(self) -> Iterator[None]:
        """One operation (a connect and a push, or a connect and a receive) ends within `timeout_s` of
        its start: every wait inside takes what is left, so phases that each wait less than the
        timeout (the members, the admission, the process group, the handshake, every bucket) cannot
        add up to several (issue 32: a member late at each phase held the learner 5x the timeout)."""
        self._deadline = time.monotonic() + self.timeout_s
        try:
            yield
        finally:
            self._deadline = None

    def time_left(self) -> float:
        """Seconds the operation in progress (bounded()) may still take, 0 once it ran out."""
        if self._deadline is None:
            return self.timeout_s
        return max(0.0, self._deadline - time.monotonic())

    def _left(self) -> float:
        """Seconds the operation in progress may still wait (`timeout_s` outside bounded())."""
        if self._deadline is None:
            return self.timeout_s
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise WeightSyncError(f"weight group rank {self.rank}: the operation ran out of its "
                                  f"{self.timeout_s:g}s (learner.weight_sync_timeout_s)")
        return left

    def _store_timeout(self, seconds: float) -> None:
        if self._store is not None:
            self._store.set_timeout(timedelta(seconds=seconds))

    @property
    def connected(self) -> bool:
        return self._pg is not None

    def connect(self, generation: int = 0) -> None:
        """Block until every rank has called ``connect(generation)``, then build the group.

        All ranks must pass the same generation; pass a new one to rebuild after a failure.
        """
        if self._store is None:
            raise WeightSyncError("weight group is closed")
        self._check_aborted()
        if self._pg is not None and generation == self._generation:
            return
        if generation in self._used:
            raise WeightSyncError(f"weight group generation {generation} was already used; pass a new one")
        self._connecting = generation  # before it counts as used: abort() wakes its rendezvous
        self._used.add(generation)
        self._drop(abort=True)
        store = dist.PrefixStore(f"{_KEY_ROOT}/g{generation}/", self._store)
        keys = [f"joined/{r}" for r in range(self.world_size)]
        try:
            self._connect_rounds(store, keys, generation)
        finally:
            self._connecting = None
            self._store_timeout(self.timeout_s)  # the store's waits outside an operation

    def _connect_rounds(self, store: dist.Store, keys: list[str], generation: int) -> None:
        try:
            self._store_timeout(self._left())  # every store wait below ends with the operation
            if self.rank == 0:
                store.set("auth/nonce", secrets.token_hex(16) if self._token else "")
            else:
                self._prove(store)
            store.set(keys[self.rank], "1")
            store.wait(keys, timedelta(seconds=min(self.member_wait_s, self._left())))
        except Exception as e:
            try:
                who = f"rank(s) {[r for r, k in enumerate(keys) if not store.check([k])]} did not connect"
            except Exception:  # the learner's store itself is gone
                who = f"lost the weight store at {self.address} ({e})"
            self._broken = f"weight group generation {generation}: {who} within {self.member_wait_s:g}s"
            raise WeightSyncError(self._broken) from e
        self._check_aborted(store)  # an abort fills the keys it waited for (see abort())
        self._store_timeout(self._left())
        self._admit(store, generation)
        # With a token the group is built on the sealed view: only admitted processes, which hold
        # the token, can find and read its rendezvous (rlfleet.weights.sealed_store).
        secret = round_secret(self._token, store.get("auth/nonce").decode()) if self._token else None
        try:
            self._store_timeout(self._left())  # the process group reads its peers' addresses here
            self._pg = self._make_pg(self._rendezvous_store(store, secret))
            if secret and self.backend == "gloo":
                check_channels(self._pg, self.rank, self.world_size, secret, self._left())
            elif secret:
                check_members(self._pg, self.rank, self.world_size, secret, self.device, self._left())
        except Exception as e:
            self._drop(abort=True)
            self._broken = f"building {self.backend} weight group failed: {e}"
            raise WeightSyncError(self._broken) from e
        self._generation, self._broken = generation, None
        self.cache.clear()
        hello = torch.tensor([_PROTOCOL, self.world_size, generation], dtype=torch.int64, device=self.device)
        self.broadcast(hello)  # also forces NCCL's lazy communicator init inside the timeout
        if hello.tolist() != [_PROTOCOL, self.world_size, generation]:
            self._drop(abort=True)
            raise WeightSyncError(f"weight group handshake mismatch: learner sent {hello.tolist()}")

    def _rendezvous_store(self, store: dist.Store, secret: bytes | None) -> dist.Store:
        if secret is None:
            return store
        # NCCL reads its rendezvous from C++: on a Python store (SealedStore) the token-protected NCCL
        # test hung on an H200 (tests/gpu/test_weight_sync_nccl.py). NCCL keeps the plain store, and
        # check_members then proves every member's token over the group itself before any weight.
        return SealedStore(store, secret) if self.backend == "gloo" else store

    def _make_pg(self, store: dist.Store) -> dist.ProcessGroup:
        # gloo's own waits while it builds (connecting to every peer) end with the operation too; every
        # later call on the group passes its own timeout
        timeout = timedelta(seconds=self._left())
        if self.backend == "gloo":
            # Gloo otherwise binds the address the machine's hostname resolves to, which another
            # host (or a network namespace) may not reach: bind the interface that routes to the store.
            opts = dist.ProcessGroupGloo._Options()
            opts._timeout = timeout
            opts._devices = [
                dist.ProcessGroupGloo.create_device(hostname=local_address_towards(self.address))]
            return dist.ProcessGroupGloo(store, self.rank, self.world_size, opts)
        opts = dist.ProcessGroupNCCL.Options()
        # NCCL's watchdog kills the process when a collective outlives its timeout,
        # so give it slack: our own poll in broadcast() fires first and aborts cleanly.
        opts._timeout = timedelta(seconds=self.timeout_s + max(10.0, self.timeout_s))
        return dist.ProcessGroupNCCL(store, self.rank, self.world_size, opts)

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Broadcast ``tensor`` in place from rank 0; raise WeightSyncError after the timeout."""
        self.finish(self.start_broadcast(tensor))

    def start_broadcast(self, tensor: torch.Tensor) -> dist.Work:
        """Issues a broadcast without waiting, so several can be in flight (finish() each, in order)."""
        if self._pg is None:
            if self._broken is not None:
                raise WeightSyncError(f"weight group is broken ({self._broken}); reconnect with a new "
                                      "generation")
            self.connect()
        assert self._pg is not None
        try:
            opts = dist.BroadcastOptions()
            opts.rootRank, opts.rootTensor = 0, 0
            opts.timeout = timedelta(seconds=self._left())
            return self._pg.broadcast([tensor], opts)
        except Exception as e:
            self._fail(e)

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sums `tensor` over every rank in place (a small acknowledgement, e.g. the IPC handoff's)."""
        if self._pg is None:
            raise WeightSyncError("weight group is not connected")
        try:
            opts = dist.AllreduceOptions()
            opts.reduceOp = dist.ReduceOp.SUM
            opts.timeout = timedelta(seconds=self._left())
            work = self._pg.allreduce([tensor], opts)
        except Exception as e:
            self._fail(e)
        self.finish(work)
        return tensor

    def finish(self, work: dist.Work) -> None:
        """Waits for a broadcast issued by start_broadcast(); WeightSyncError after the timeout."""
        try:
            if self.backend == "gloo":
                self._wait(work)
            else:
                self._poll(work)
        except Exception as e:
            self._fail(e)

    def _wait(self, work: dist.Work) -> None:
        """gloo honours a wait's timeout without cancelling the work, so the wait is taken in slices of
        ABORT_CHECK_S, between which an abort() is seen; a work that completes returns at once. The
        whole wait ends when the operation's time is up, as one wait would (outside bounded() too: a
        fixed end, not the timeout afresh each slice)."""
        start = time.monotonic()
        end = start + self._left()
        while not work.is_completed():
            self._check_aborted()
            left = end - time.monotonic()
            if left <= 0:
                raise WeightSyncError(f"weight broadcast timed out after {time.monotonic() - start:.3g}s on "
                                      f"rank {self.rank} (learner.weight_sync_timeout_s={self.timeout_s:g})")
            try:
                work.wait(timedelta(seconds=min(ABORT_CHECK_S, left)))
            except Exception:
                if not work.is_completed():
                    continue  # the slice ran out
        work.wait()  # completed: returns, or raises the work's own error (a slice's timeout that raced
        # with the completion is not taken for a failure)

    def fail(self, reason: str) -> NoReturn:
        """Breaks the group from above (a rank can no longer follow the push): every rank must reconnect."""
        self._fail(WeightSyncError(f"weight group rank {self.rank}: {reason}"))

    def _fail(self, e: Exception) -> NoReturn:
        """Marks the group broken (every rank must reconnect) and raises WeightSyncError."""
        self._broken = f"{type(e).__name__}: {e}"
        self._drop(abort=True)
        if isinstance(e, WeightSyncError):
            raise e
        raise WeightSyncError(f"weight broadcast failed on rank {self.rank}: {e}") from e

    def _poll(self, work: dist.Work) -> None:
        """NCCL's ``wait()`` only orders streams; poll completion on the CPU with a deadline.

        The sleep grows with the time already waited (1/16 of it, 20 us to 10 ms), so a broadcast
        is noticed at most ~6 % after it completes: a doubling backoff could oversleep a 4 ms
        broadcast by up to 3 ms, which on a small model was a large part of the push."""
        start = time.monotonic()
        deadline = start + self._left()
        while not work.is_completed():
            self._check_aborted()  # then _fail aborts the communicator, which ends the kernel in flight
            now = time.monotonic()
            if now > deadline:
                raise WeightSyncError(f"weight broadcast timed out after {now - start:.3g}s on rank "
                                      f"{self.rank} (learner.weight_sync_timeout_s={self.timeout_s:g})")
            time.sleep(min(0.01, max(2e-5, (now - start) / 16)))
        work.wait()  # re-raises a stored error; makes the current stream wait for NCCL's

    def _drop(self, abort: bool) -> None:
        pg, self._pg = self._pg, None
        self.cache.clear()
        if pg is None:
            return
        if self.backend == "gloo":  # gloo needs no teardown: dropping the object closes its sockets
            if self._aborted is not None:
                # but its destructor waits for the work in flight (to the operation's timeout): an
                # aborted operation must not, so the last reference goes in a thread of its own
                held = [pg]
                del pg
                threading.Thread(target=held.clear, daemon=True, name="weight-group-release").start()
            return
        try:
            pg.abort() if abort else pg.shutdown()
        except Exception:
            pass

    def close(self) -> None:
        """Tear down the group and release the store (rank 0 stops serving it)."""
        self._drop(abort=self._broken is not None)
        store, self._store = self._store, None
        if store is not None and self.rank == 0 and self._aborted is not None:
            held = [store]
            del store
            linger = threading.Timer(ABORT_LINGER_S, held.clear)
            linger.daemon = True
            linger.start()

    def __enter__(self) -> WeightGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"WeightGroup(rank={self.rank}/{self.world_size}, backend={self.backend}, "
                f"device={self.device}, address={self.address}, generation={self._generation})")
