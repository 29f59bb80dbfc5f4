"""The weight group's rendezvous, sealed with the token, and the check of every channel.

Why: the learner's TCPStore has no authentication and anyone who reaches its port can
list and read every key. Proving the token to the learner (group.py's admission) is not
enough on its own: admission was per rank *slot*, so a process without the token could
wait for the verdict on the real rank's proof and then build that rank's gloo group from
the public rendezvous keys, receiving the weights (issue 15). Two things bind the group
to the processes that hold the token:

- `SealedStore`: the process group is built on a view of the store whose key names are
  derived from a per-round secret (HMAC of the token and the learner's fresh nonce) and
  whose values are encrypted and authenticated with it. A process without the token finds
  neither the keys it would need nor readable addresses in them (gloo's listening
  addresses, NCCL's unique id with its random magic); a value it forges is refused.
- `check_channels` (gloo): once the group is built, every rank sends every other rank a
  tag only a holder of the round's secret can compute, over the very connection the
  weights will use, and checks the tag it receives. A process that got into a
  connection in place of a rank (say by racing gloo's listener) is found before any
  weight is sent, and the group is dropped.

Cipher: AES-256-GCM from the `cryptography` package (a well-kept AEAD, not one written here;
issue 22), a random 96-bit nonce per value, and the value's sealed key name as associated data,
so a value copied under another entry is refused too. Keys are derived from the round's secret
with HMAC-SHA256 (one for names, one for values).
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import timedelta

import torch
import torch.distributed as dist

from rlfleet.errors import WeightSyncError

_NONCE = 12  # AES-GCM's standard nonce size
_TAG = 32  # bytes of a channel tag (HMAC-SHA256)
_CHANNEL_TAG = 0x52_4C  # p2p tag of the channel check, apart from anything else sent on the group


def round_secret(token: str, nonce: str) -> bytes:
    """The secret of one rendezvous round; the admission proofs (HMAC of `nonce:rank`) do not reveal it."""
    return hmac.new(token.encode(), f"weight-group:{nonce}".encode(), hashlib.sha256).digest()


def _derive(secret: bytes, label: str) -> bytes:
    return hmac.new(secret, label.encode(), hashlib.sha256).digest()


def sealed_value_key(secret: bytes) -> bytes:
    """The AES-256-GCM key of a round's values."""
    return _derive(secret, "values")


class SealedStore(dist.Store):
    """A `dist.Store` over `inner` with secret key names and encrypted, authenticated values."""

    def __init__(self, inner: dist.Store, secret: bytes) -> None:
        # Imported here, not with the module: only a job with security.token seals its rendezvous, and
        # the package (its Rust extension and OpenSSL) is ~6 MB resident in every rollout and learner.
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        super().__init__()
        self._inner = inner
        self._names = _derive(secret, "names")
        self._aead = AESGCM(sealed_value_key(secret))

    def sealed_name(self, key: str) -> str:
        """The name `key` is stored under in the inner store."""
        return "sealed/" + hmac.new(self._names, key.encode(), hashlib.sha256).hexdigest()[:40]

    def seal(self, key: str, value: bytes) -> bytes:
        nonce = secrets.token_bytes(_NONCE)
        return nonce + self._aead.encrypt(nonce, value, self.sealed_name(key).encode())

    def unseal(self, key: str, sealed: bytes) -> bytes:
        from cryptography.exceptions import InvalidTag  # loaded already by __init__'s AESGCM

        try:
            if len(sealed) < _NONCE + 16:
                raise InvalidTag
            return self._aead.decrypt(sealed[:_NONCE], sealed[_NONCE:], self.sealed_name(key).encode())
        except InvalidTag:
            raise WeightSyncError(f"weight group rendezvous entry {key!r} was not written by a holder of the "
                                  "token (tampered store?)") from None

    # ---- dist.Store -------------------------------------------------------------------------------
    def set(self, key: str, value: bytes | str) -> None:
        self._inner.set(self.sealed_name(key), self.seal(key, value.encode()
                                                   if isinstance(value, str) else bytes(value)))

    def get(self, key: str) -> bytes:
        return self.unseal(key, self._inner.get(self.sealed_name(key)))

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        names = [self.sealed_name(k) for k in keys]
        self._inner.wait(names, timeout) if timeout is not None else self._inner.wait(names)

    def check(self, keys: list[str]) -> bool:
        return self._inner.check([self.sealed_name(k) for k in keys])

    def add(self, key: str, amount: int) -> int:  # a counter is not secret; its name still is
        return self._inner.add(self.sealed_name(key), amount)

    def delete_key(self, key: str) -> bool:
        return self._inner.delete_key(self.sealed_name(key))

    def set_timeout(self, timeout: timedelta) -> None:
        self._inner.set_timeout(timeout)


def _channel_tag(secret: bytes, src: int, dst: int) -> torch.Tensor:
    digest = hmac.new(secret, f"channel:{src}->{dst}".encode(), hashlib.sha256).digest()
    return torch.frombuffer(bytearray(digest), dtype=torch.uint8)


def check_channels(pg: dist.ProcessGroup, rank: int, world_size: int, secret: bytes,
                   timeout_s: float) -> None:
    """Every rank proves the round's secret to every other over their gloo connection; raises
    WeightSyncError naming the peers whose proof was wrong. gloo's send is buffered, so posting
    every send before the receives cannot deadlock."""
    peers = [r for r in range(world_size) if r != rank]
    sends = [pg.send([_channel_tag(secret, rank, peer)], peer, _CHANNEL_TAG) for peer in peers]
    received = {peer: torch.zeros(_TAG, dtype=torch.uint8) for peer in peers}
    recvs = [pg.recv([received[peer]], peer, _CHANNEL_TAG) for peer in peers]
    for work in [*sends, *recvs]:
        work.wait(timedelta(seconds=timeout_s))
    impostors = [peer for peer in peers if not hmac.compare_digest(
        bytes(received[peer].tolist()), bytes(_channel_tag(secret, peer, rank).tolist()))]
    if impostors:
        raise WeightSyncError(f"weight group rank {rank}: the connection to rank(s) {impostors} is held by a "
                              "process without the weight-group token; no weights were sent")


def check_members(pg: dist.ProcessGroup, rank: int, world_size: int, secret: bytes, device: torch.device,
                  timeout_s: float) -> None:
    """Every rank proves the round's secret to all others with one all-gather of 32-byte tags, on the
    group's own device (so NCCL too); raises WeightSyncError naming the ranks whose proof was wrong.
    A process that took a rank's place in the group without the token is caught before any weight."""
    gathered = [torch.zeros(_TAG, dtype=torch.uint8, device=device) for _ in range(world_size)]
    pg.allgather([gathered], [_channel_tag(secret, rank, -1).to(device)]).wait(timedelta(seconds=timeout_s))
    impostors = [r for r in range(world_size) if r != rank and not hmac.compare_digest(
        bytes(gathered[r].cpu().tolist()), bytes(_channel_tag(secret, r, -1).tolist()))]
    if impostors:
        raise WeightSyncError(f"weight group rank {rank}: rank(s) {impostors} of the group are held by a "
                              "process without the weight-group token; no weights were sent")
