"""Client of an environment server (rlfleet.v1.Environment), for the rollout's agent loop.

Calls are batched (`batch_size` episodes a call, the calls of one turn sent together) and carry a
deadline (`timeout_s`). They are never retried: Step changes an episode's state. Every failure
comes back per episode as a StepResult with ok=False, `failure` set to its cause and `error`
naming the episode, so a slow, dead or confused server fails those episodes, never the rollout:

    unavailable    the server cannot be reached (UNAVAILABLE): an outage, admission pauses
    timeout        the call's deadline passed (DEADLINE_EXCEEDED)
    invalid_reply  a reply that breaks the contract (count, ids, a non-finite reward)
    episode_error  the server answered ok=false for the episode
    rpc_error      any other gRPC status

A call that ends UNAVAILABLE retires the channel: the next call opens a fresh one, which connects at
once, where the old one would sit in gRPC's reconnect backoff (up to 2 minutes) and fail the first
calls after the server is back with "Connection refused".
"""
from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import grpc

from rlfleet.env.types import (EPISODE_ERROR, INVALID_REPLY, RPC_ERROR, TIMEOUT, UNAVAILABLE, Action,
                               EpisodeRow, StepResult)
from rlfleet.proto.v1 import environment_pb2_grpc
from rlfleet.rpc import env_convert
from rlfleet.rpc.channel import open_channel
from rlfleet.rpc.security import Security



def failed(episode_id: str, cause: str, error: str) -> StepResult:
    return StepResult(episode_id=episode_id, ok=False, failure=cause, error=error)


class EnvClient:
    def __init__(self, address: str, timeout_s: float = 30.0, batch_size: int = 64, max_concurrency: int = 4,
                 security: Security | None = None):
        self.address, self.timeout_s, self.batch_size = address, timeout_s, batch_size
        self.security = security
        self._lock = threading.Lock()
        self._connection = _Connection(open_channel(address, security))
        self._pool = ThreadPoolExecutor(max_concurrency, thread_name_prefix="env-call")

    def start(self, rows: Sequence[EpisodeRow]) -> tuple[list[StepResult], float]:
        return self._batched([r.episode_id for r in rows], rows, "Start", env_convert.start_request)

    def step(self, actions: Sequence[Action]) -> tuple[list[StepResult], float]:
        return self._batched([a.episode_id for a in actions], actions, "Step", env_convert.step_request)

    def end(self, episode_ids: Sequence[str], reason: str) -> tuple[list[StepResult], float]:
        return self._batched(list(episode_ids), list(episode_ids), "End",
                             lambda ids: env_convert.end_request(ids, reason))

    def end_quietly(self, episode_ids: Sequence[str], reason: str) -> None:
        """Best effort, off the caller's path: End for episodes the rollout gives up (a failed call, an
        abandoned request), so that the server can free what it holds; the answers are not read."""
        ids = list(episode_ids)
        for i in range(0, len(ids), self.batch_size):
            chunk = ids[i:i + self.batch_size]
            try:
                self._pool.submit(self._call, chunk, "End", env_convert.end_request(chunk, reason))
            except RuntimeError:  # the client is closing: the server's idle expiry has them
                return

    def _batched(self, ids: list[str], items: Sequence, rpc: str, build: Callable
                 ) -> tuple[list[StepResult], float]:
        """One result per id, in order, and the calls' wall time."""
        if not items:
            return [], 0.0
        started = time.perf_counter()
        chunks = [(ids[i:i + self.batch_size], items[i:i + self.batch_size])
                  for i in range(0, len(items), self.batch_size)]
        futures = [self._pool.submit(self._call, chunk_ids, rpc, build(chunk)) for chunk_ids, chunk in chunks]
        results = [r for f in futures for r in f.result()]
        return results, time.perf_counter() - started

    def _call(self, ids: list[str], rpc: str, request) -> list[StepResult]:
        with self._lock:
            connection = self._connection
            connection.calls += 1
        try:
            reply = getattr(connection.stub, rpc)(request, timeout=self.timeout_s)
        except grpc.RpcError as err:
            code = err.code()
            if code == grpc.StatusCode.UNAVAILABLE:
                self._reconnect(connection)
            cause = {grpc.StatusCode.UNAVAILABLE: UNAVAILABLE,
                     grpc.StatusCode.DEADLINE_EXCEEDED: TIMEOUT}.get(code, RPC_ERROR)
            return [failed(i, cause, f"episode {i}: environment {self.address} {rpc}: {code.name}: "
                                     f"{err.details()}") for i in ids]
        finally:
            self._done(connection)
        return check_reply(ids, [env_convert.result_from_proto(r) for r in reply.results], self.address)

    def _reconnect(self, failed: _Connection) -> None:
        """The next calls go on a fresh channel; `failed` closes once its calls in flight are over."""
        with self._lock:
            if self._connection is failed:
                failed.retired = True
                self._connection = _Connection(open_channel(self.address, self.security))

    def _done(self, connection: _Connection) -> None:
        with self._lock:
            connection.calls -= 1
            close = connection.retired and connection.calls == 0
        if close:
            connection.channel.close()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            self._connection.channel.close()


class _Connection:
    """A channel, its stub and the calls in flight on it."""

    def __init__(self, channel: grpc.Channel):
        self.channel = channel
        self.stub = environment_pb2_grpc.EnvironmentStub(channel)
        self.calls = 0
        self.retired = False


def check_reply(ids: list[str], results: list[StepResult], address: str) -> list[StepResult]:
    """The contract's checks of a reply; what breaks it fails the episodes it concerns, saying how."""
    if len(results) != len(ids):
        return [failed(i, INVALID_REPLY, f"episode {i}: environment {address} answered {len(results)} "
                                         f"results for {len(ids)} episodes") for i in ids]
    out = []
    for position, (episode_id, result) in enumerate(zip(ids, results)):
        if result.episode_id != episode_id:
            out.append(failed(episode_id, INVALID_REPLY, f"episode {episode_id}: environment {address} "
                              f"answered for {result.episode_id!r} at position {position}"))
        elif result.reward is not None and not math.isfinite(result.reward):
            out.append(failed(episode_id, INVALID_REPLY, f"episode {episode_id}: environment {address} "
                              f"gave the non-finite reward {result.reward}"))
        elif not result.ok:
            error = result.error or "ok=false without an error"
            if episode_id not in error:
                error = f"episode {episode_id}: {error}"
            out.append(replace(result, failure=EPISODE_ERROR, error=error))
        else:
            out.append(result)
    return out
