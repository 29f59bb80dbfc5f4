"""Client of one external reward server, for `reward.sources` (the reward service calls it).

A batch is split into calls of `batch_size` items, at most `max_concurrency` in
flight. Each call has its own deadline (`timeout_s`). A call that fails
transiently (UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ABORTED) is
retried up to `max_retries` times, after exponential backoff with jitter. A call
that failed (after its retries: one call is one failure) or whose reply broke the
contract counts once towards the circuit breaker, a good reply resets it.

A server that cannot score now (it failed transiently after the retries, or its
circuit is open) raises SourceUnavailable, naming the root cause of the last real
failure (e.g. "connection refused"): the reward service then fails the whole Score
call with UNAVAILABLE, so the controller waits for the source instead of counting
samples without a reward. A reply that breaks the contract (wrong count, ids out
of order, a non-finite score marked ok) is never retried: its items fail with an
error that says so. Nothing here ever invents a score: every item the server did
not score comes back ok=false with the reason, or the call fails as a whole.
"""
from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import grpc
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlfleet.errors import ServiceUnavailable
from rlfleet.proto.v1 import reward_pb2_grpc
from rlfleet.reward_config import RewardSourceConfig
from rlfleet.reward_stats import SourceStats
from rlfleet.rpc import convert
from rlfleet.rpc.security import Security, secure_channel
from rlfleet.types import ScoreItem, ScoreResult
from services.reward.sources.breaker import HALF_OPEN, CircuitBreaker

log = structlog.get_logger(__name__)

TRANSIENT = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                       grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.ABORTED})


class SourceUnavailable(ServiceUnavailable):
    """A reward source cannot score now: unreachable, or its circuit is open after repeated failures."""


def failed(items: list[ScoreItem], error: str) -> list[ScoreResult]:
    return [ScoreResult(id=i.id, score=0.0, ok=False, error=error) for i in items]


def check_reply(items: list[ScoreItem], results: list[ScoreResult]) -> str | None:
    """What breaks the contract in a reply as a whole, or None."""
    if len(results) != len(items):
        return f"returned {len(results)} results for {len(items)} items"
    for position, (item, result) in enumerate(zip(items, results)):
        if result.id != item.id:
            return (f"result {position} has id {result.id!r}, expected {item.id!r} "
                    "(results must keep item order)")
    return None


def wait_ready(channel: grpc.Channel, label: str, timeout_s: float, alive: Callable[[], bool]) -> None:
    """Until grpc.health.v1 says SERVING; a server without the health service is taken as ready."""
    stub = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + timeout_s
    status = "UNREACHABLE"
    warn_at = time.monotonic() + 3.0  # a server that is not up soon is said so, not waited for in silence
    while time.monotonic() < deadline and alive():
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=2.0)
            status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
            if status == "SERVING":
                return
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                log.warning("reward server has no health service; assuming it is ready", source=label)
                return
            status = f"{err.code().name}: {err.details()}"
        if warn_at and time.monotonic() > warn_at:
            log.warning(f"waiting for {label} (up to {timeout_s:.0f}s): {status}")
            warn_at = 0.0
        time.sleep(0.2)
    raise ServiceUnavailable(f"{label} is not serving after {timeout_s:.0f}s (health: {status})")


class RemoteSource:
    def __init__(self, cfg: RewardSourceConfig, address: str, connect_timeout_s: float = 60.0,
                 alive: Callable[[], bool] = lambda: True, wait: bool = True,
                 security: Security | None = None):
        """`security`: the fleet's TLS and bearer token, used when the source has fleet_security
        (None: plain gRPC)."""
        self.cfg, self.name, self.weight, self.address = cfg, cfg.name, cfg.weight, address
        self.label = f"reward source {cfg.name!r} at {address}"
        self.stats = SourceStats()
        self.breaker = CircuitBreaker(cfg.circuit_failures, cfg.circuit_cooldown_s)
        self.last_cause = ""  # what made the last call fail: an open circuit's error names it
        # gRPC's own reconnect backoff must not outlast ours: a server that is back is seen soon.
        # The fleet's TLS and bearer token, or plain gRPC (same message limit) for a server outside it.
        security = security or Security()
        plain = Security(max_message_bytes=security.max_message_bytes)
        self.channel = secure_channel(address, security if cfg.fleet_security else plain, extra_options=[
            ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 2000)])
        self._stub = reward_pb2_grpc.RewardStub(self.channel)
        self._pool = ThreadPoolExecutor(cfg.max_concurrency, thread_name_prefix=f"reward-{cfg.name}")
        if wait:
            try:
                wait_ready(self.channel, self.label, connect_timeout_s, alive)
            except BaseException:
                self.close()
                raise

    def score(self, items: list[ScoreItem], stats: SourceStats | None = None) -> list[ScoreResult]:
        stats = stats or SourceStats(parent=self.stats)
        size = self.cfg.batch_size
        chunks = [items[i:i + size] for i in range(0, len(items), size)]
        stats.add(items=len(items))
        results = [r for chunk in self._pool.map(lambda c: self._call(c, stats), chunks) for r in chunk]
        stats.add(errors=sum(not r.ok for r in results))
        return results

    def _call(self, items: list[ScoreItem], stats: SourceStats) -> list[ScoreResult]:
        state = self.breaker.allow()
        if state is None:
            stats.add(rejected=len(items))
            raise SourceUnavailable(f"{self.label} is unavailable: {self.last_cause or 'repeated failures'} "
                                    f"(circuit open, next probe in {self.breaker.retry_in_s():.1f}s)")
        if state == HALF_OPEN and not self._reachable():
            self.breaker.record_failure()
            raise SourceUnavailable(f"{self.label} is unavailable: {self.last_cause or 'unreachable'} "
                                    f"(probe: not reachable within {self._probe_wait_s():g}s)")
        request = convert.score_items_to_proto(items)
        attempts = self.cfg.max_retries + 1
        for attempt in range(attempts):
            started = time.monotonic()
            try:
                reply = self._stub.Score(request, timeout=self.cfg.timeout_s)
            except grpc.RpcError as err:
                stats.call(time.monotonic() - started)
                code = err.code()
                if code in TRANSIENT and attempt + 1 < attempts:
                    stats.add(retries=1)
                    time.sleep(self._backoff(attempt))
                    continue
                self.breaker.record_failure()  # once per call, however many attempts it took
                detail = (f"deadline of {self.cfg.timeout_s:g}s exceeded" if code
                          == grpc.StatusCode.DEADLINE_EXCEEDED else err.details())
                self.last_cause = f"Score failed with {code.name}: {detail}"
                tries = f"(after {attempt + 1} attempt{'s' if attempt else ''})"
                if code in TRANSIENT:
                    raise SourceUnavailable(
                        f"{self.label} is unavailable: {self.last_cause} {tries}") from None
                log.warning("reward call failed", source=self.name, address=self.address, code=code.name,
                            error=detail, attempts=attempt + 1)
                return failed(items, f"{self.label}: {self.last_cause} {tries}")
            stats.call(time.monotonic() - started)
            return self._accept(items, convert.score_results_from_proto(reply))
        raise AssertionError("unreachable")

    def _probe_wait_s(self) -> float:
        return min(self.cfg.timeout_s, 5.0)

    def _reachable(self) -> bool:
        """Whether the channel connects within a few seconds: a probe to a server that is still down
        fails in that time rather than waiting out its call deadline."""
        try:
            grpc.channel_ready_future(self.channel).result(timeout=self._probe_wait_s())
        except grpc.FutureTimeoutError:
            return False
        return True

    def _accept(self, items: list[ScoreItem], results: list[ScoreResult]) -> list[ScoreResult]:
        problem = check_reply(items, results)
        if problem is not None:
            self.breaker.record_failure()
            self.last_cause = f"broke the reward contract: {problem}"
            log.error("reward server broke the contract", source=self.name, address=self.address,
                      error=problem)
            return failed(items, f"{self.label} broke the reward contract: {problem}")
        out = []
        for r in results:
            if r.ok and not math.isfinite(r.score):
                log.error("reward server returned a non-finite score", source=self.name, item=r.id,
                          score=r.score)
                out.append(ScoreResult(r.id, 0.0, ok=False, error=f"{self.label} broke the reward contract: "
                                       f"score {r.score} for an ok result"))
            elif not r.ok:
                out.append(ScoreResult(r.id, 0.0, ok=False, error=f"{self.label}: {r.error or 'not scored'}"))
            else:
                out.append(r)
        if any(r.ok and not math.isfinite(r.score) for r in results):  # a broken reply is a failed call
            self.breaker.record_failure()
            self.last_cause = "broke the reward contract: a non-finite score for an ok result"
        else:
            self.breaker.record_success()
        return out

    def _backoff(self, attempt: int) -> float:
        delay = min(self.cfg.backoff_max_s, self.cfg.backoff_s * (2 ** attempt))
        return delay * random.uniform(0.5, 1.0)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.channel.close()
