"""Where a rollout replica holds its groups' payloads until the learner has fetched and the controller
released them. A replica that dies loses what it holds: the controller re-queues the prompts whose
payloads were not fetched yet (nothing is lost; what was fetched is not generated again)."""
from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable

from rlfleet.errors import RlfleetError
from rlfleet.dataplane.payload import TokenPayload


class PayloadMissing(RlfleetError, KeyError):
    """A fetch named groups the store does not hold (never put, or released already), or whose replica
    is gone: not the learner's own failure, so not retried as an unreachable learner."""

    grpc_code = "FAILED_PRECONDITION"

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class PayloadStore(ABC):
    @abstractmethod
    def put(self, request_id: str, payloads: list[TokenPayload]) -> None: ...

    @abstractmethod
    def get(self, request_ids: Iterable[str]) -> dict[str, list[TokenPayload]]:
        """The payloads of `request_ids`, in that order; PayloadMissing names any not held."""

    @abstractmethod
    def release(self, request_ids: Iterable[str]) -> int:
        """Forgets `request_ids` (those not held are ignored); returns how many were held."""

    @abstractmethod
    def held(self) -> list[str]: ...


class MemoryStore(PayloadStore):
    """The payloads in this process's memory, safe to use from several threads."""

    def __init__(self) -> None:
        self._groups: dict[str, list[TokenPayload]] = {}
        self._lock = threading.Lock()

    def put(self, request_id: str, payloads: list[TokenPayload]) -> None:
        with self._lock:
            self._groups[request_id] = payloads

    def get(self, request_ids: Iterable[str]) -> dict[str, list[TokenPayload]]:
        ids = list(request_ids)
        with self._lock:
            missing = [rid for rid in ids if rid not in self._groups]
            if missing:
                raise PayloadMissing(f"{len(missing)} group(s) not held here: {missing[:5]}")
            return {rid: self._groups[rid] for rid in ids}

    def release(self, request_ids: Iterable[str]) -> int:
        with self._lock:
            return sum(self._groups.pop(rid, None) is not None for rid in request_ids)

    def held(self) -> list[str]:
        with self._lock:
            return list(self._groups)
