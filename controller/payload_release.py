"""controller.data_plane=flight: groups the controller drops (stale, filtered, unusable) are never
fetched by the learner, so their replicas, and the learner's staging store they were pushed to, are
told to forget them, off the training thread (issue 44). A replica gone took them along: nothing to do
then."""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import structlog

from rlfleet.dataplane.flight import PayloadClient
from rlfleet.dataplane.staging import staged_key
from rlfleet.config import JobConfig
from rlfleet.errors import RlfleetError
from controller.groups import ScoredGroup

log = structlog.get_logger(__name__)


class PayloadReleaser:
    def __init__(self, client: PayloadClient, sink: Callable[[], str] = lambda: ""):
        """`sink`: the learner's staging store now (empty: none)."""
        self._client, self._sink = client, sink
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="payload-release")

    def release(self, group: ScoredGroup) -> None:
        held: dict[str, set[str]] = defaultdict(set)
        for c in group.completions:
            if c.payload is not None:
                held[c.payload.address].add(c.payload.request_id)
        for address, ids in held.items():
            self._pool.submit(self._release, address, sorted(ids))
        sink = self._sink()
        if sink and held:
            keys = sorted(staged_key(address, rid) for address, ids in held.items() for rid in ids)
            self._pool.submit(self._release, sink, keys)

    def _release(self, address: str, ids: list[str]) -> None:
        try:
            self._client.release(address, ids)
        except RlfleetError as exc:
            log.info("data plane release of dropped groups failed", address=address, error=str(exc)[:200])

    def close(self, wait: bool = False) -> None:
        self._pool.shutdown(wait=wait)
        self._client.close()


RELEASE_TIMEOUT_S = 10.0  # a release is a courtesy: the controller never waits long on one


def payload_releaser(cfg: JobConfig, sink: Callable[[], str]) -> PayloadReleaser | None:
    if cfg.controller.data_plane != "flight":
        return None
    from rlfleet.dataplane.flight import PayloadClient
    from rlfleet.rpc.security import Security

    return PayloadReleaser(PayloadClient(Security.from_config(cfg.security, cfg.limits),
                                         timeout_s=RELEASE_TIMEOUT_S), sink)
