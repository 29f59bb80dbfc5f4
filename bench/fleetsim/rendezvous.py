"""The simulator's weight group: a rendezvous over real sockets, modelled on rlfleet.weights.group.

The simulated learner hosts it (a TCP server per group, as a TCPStore per group; one connection per
member). A member joins
by connecting and naming its rank; its pull is its arrival. A push of a group not yet connected
waits for every rank to arrive (min(timeout, MEMBER_WAIT_S), as WeightGroup.connect), then, like a
collective, waits for every rank to enter the pull of that version: a member that died (its process
killed, its socket gone) never enters, and the push hangs until the group's timeout, as an NCCL
broadcast does. Only then does it take the modelled broadcast's time and release the members.
An abort (the learner's AbortWeightGroup) ends the push in either wait at once, tells every member,
and fails any later push or pull of that group, as rlfleet.weights.group's abort() does.

Wire (lines): member -> learner `join RANK`, `pull VERSION`; learner -> member `ok` or `fail REASON`.
A group is named by its address, `HOST:PORT`.
"""
from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field

from rlfleet.errors import WeightSyncError

MEMBER_WAIT_S = 20.0  # rlfleet.weights.group.MEMBER_WAIT_S


@dataclass
class _Group:
    world_size: int
    connected: bool = False
    conns: dict[int, socket.socket] = field(default_factory=dict)  # rank -> its connection
    entered: dict[int, int] = field(default_factory=dict)  # rank -> the version its pull waits for
    dead: set[int] = field(default_factory=set)
    pushing: bool = False
    aborted: str | None = None  # why abort() ended the group


class RendezvousServer:
    def __init__(self, host: str = "127.0.0.1"):
        self.host = host
        self._groups: dict[str, _Group] = {}
        self._cond = threading.Condition()

    def open(self, world_size: int) -> str:
        sock = socket.create_server((self.host, 0))
        address = f"{self.host}:{sock.getsockname()[1]}"
        with self._cond:
            self._groups[address] = _Group(world_size)
        threading.Thread(target=self._accept, args=(sock, address), daemon=True, name="rendezvous").start()
        return address

    def _accept(self, sock: socket.socket, gid: str) -> None:
        while True:
            conn, _ = sock.accept()
            threading.Thread(target=self._serve, args=(conn, gid), daemon=True).start()

    def _serve(self, conn: socket.socket, gid: str) -> None:
        rank = None
        try:
            for line in conn.makefile("r"):
                verb, value = line.split()
                number = int(value)
                with self._cond:
                    g = self._groups[gid]
                    if verb == "join":
                        rank = number
                        g.conns[rank] = conn
                        g.dead.discard(rank)
                    elif verb == "pull" and rank is not None and g.aborted is not None:
                        self._send(g, rank, f"fail weight group aborted: {g.aborted}")
                    elif verb == "pull" and rank is not None:
                        g.entered[rank] = number
                    self._cond.notify_all()
        except (OSError, ValueError, KeyError):
            pass
        finally:  # the member's process died or it left: a collective with it can no longer finish
            with self._cond:
                if rank is not None:
                    self._groups[gid].dead.add(rank)
                    self._groups[gid].entered.pop(rank, None)
                self._cond.notify_all()
            conn.close()

    def push(self, address: str, version: int, timeout_s: float, broadcast_s: float) -> None:
        """Blocks as a push of `version` to the group at `address` would; WeightSyncError on timeout."""
        start = time.monotonic()
        with self._cond:
            g = self._groups[address]
            self._check_aborted(g)
            ranks = range(1, g.world_size)
            g.pushing = True
            self._cond.notify_all()
            try:
                if not g.connected:
                    wait_s = min(timeout_s, MEMBER_WAIT_S)
                    arrived = self._cond.wait_for(
                        lambda: g.aborted is not None or all(r in g.entered for r in ranks), wait_s)
                    self._check_aborted(g)
                    if not arrived:
                        missing = [r for r in ranks if r not in g.entered]
                        self._fail(g, f"rank(s) {missing} did not connect within {wait_s:g}s")
                    g.connected = True
                left = timeout_s - (time.monotonic() - start)
                entered = self._cond.wait_for(
                    lambda: g.aborted is not None or all(g.entered.get(r) == version for r in ranks), left)
                self._check_aborted(g)
                if not entered:
                    missing = [r for r in ranks if g.entered.get(r) != version]
                    self._fail(g, f"broadcast of version {version} timed out after {timeout_s:g}s "
                                  f"waiting for rank(s) {missing}")
            finally:
                g.pushing = False
        time.sleep(broadcast_s)
        with self._cond:
            for rank in ranks:
                g.entered.pop(rank, None)
                self._send(g, rank, "ok")

    def abort(self, address: str, reason: str) -> bool:
        """The learner's AbortWeightGroup: ends the push on the group at `address` at once (WeightSyncError
        naming `reason`), tells every member, and fails every later push and pull of it. Returns whether a
        push was on it; no such group: False, nothing done."""
        with self._cond:
            g = self._groups.get(address)
            if g is None:
                return False
            g.aborted = reason or "no reason given"
            if not g.pushing:  # a pushing one tells its members itself (_check_aborted)
                for rank in list(g.conns):
                    self._send(g, rank, f"fail weight group aborted: {g.aborted}")
                g.entered.clear()
            self._cond.notify_all()
            return g.pushing

    def wait_pushing(self, address: str, timeout_s: float) -> bool:
        """Until a push on the group at `address` is in progress (tests): whether one is."""
        with self._cond:
            return self._cond.wait_for(lambda: self._groups[address].pushing, timeout_s)

    def _check_aborted(self, g: _Group) -> None:
        if g.aborted is not None:
            self._fail(g, f"weight group aborted: {g.aborted}")

    def _fail(self, g: _Group, reason: str) -> None:
        for rank in list(g.conns):
            self._send(g, rank, "fail " + reason)
        g.entered.clear()
        raise WeightSyncError(reason)

    @staticmethod
    def _send(g: _Group, rank: int, line: str) -> None:
        try:
            g.conns[rank].sendall((line + "\n").encode())
        except (OSError, KeyError):
            pass


class RendezvousMember:
    """A rollout rank's side: joined at JoinWeightGroup, pulls block until the learner's push ends."""

    def __init__(self, address: str, rank: int, timeout_s: float):
        host, port = address.rsplit(":", 1)
        self.gid, self.timeout_s = address, timeout_s
        try:
            self._sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        except OSError as exc:
            raise WeightSyncError(f"weight group at {address}: {exc}") from exc
        self._lines = self._sock.makefile("r")
        self._sock.sendall(f"join {rank}\n".encode())

    def pull(self, version: int) -> None:
        try:
            self._sock.settimeout(self.timeout_s + 5)
            self._sock.sendall(f"pull {version}\n".encode())
            answer = self._lines.readline().strip()
        except OSError as exc:
            raise WeightSyncError(f"weight group {self.gid}: {exc}") from exc
        if answer != "ok":
            raise WeightSyncError(f"weight group {self.gid}: {answer or 'the learner closed it'}")

    def close(self) -> None:
        """As the process's death does: the connection goes, the learner sees the rank gone."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
