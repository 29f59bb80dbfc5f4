"""Environment gRPC servicer: keeps episode states by id, answers the batched contract, and turns an
environment's exceptions into per-episode errors (ok=false, naming the episode).

Episodes idle for `idle_expiry_s` (no Step or End; 10 minutes by default) are expired: their state
is dropped and the environment's `end(state, "expired")` frees what it holds. The contract asks
servers to do so, because End may never come (a rollout that crashed, an End that failed too)."""
from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import structlog

from rlfleet.env.base import Environment
from rlfleet.env.contract import CONTRACT_REVISION
from rlfleet.env.types import Action, EpisodeRow, Observation, StepResult
from rlfleet.errors import RlfleetError
from rlfleet.metrics import ServiceMetrics
from rlfleet.proto.v1 import environment_pb2, environment_pb2_grpc
from rlfleet.rpc import env_convert
from rlfleet.rpc.errors import rpc_method

log = structlog.get_logger(__name__)
IDLE_EXPIRY_S = 600.0  # an episode no call named for this long is expired
SERVICE_NAME = environment_pb2.DESCRIPTOR.services_by_name["Environment"].full_name


class DeadlinePassed(RlfleetError, TimeoutError):
    grpc_code = "DEADLINE_EXCEEDED"


class EnvironmentServicer(environment_pb2_grpc.EnvironmentServicer):
    role = "environment"

    def __init__(self, env: Environment, workers: int = 8, idle_expiry_s: float = IDLE_EXPIRY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.env = env
        self.metrics = ServiceMetrics.create(self.role)
        self.last_error = ""
        self._states: dict[str, Any] = {}
        self._touched: dict[str, float] = {}  # episode id -> when a call last named it
        self.idle_expiry_s, self.clock = idle_expiry_s, clock
        self._swept_at = clock()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="episode")

    # ---- the contract ---------------------------------------------------------------------------
    @rpc_method
    def Start(self, request, context):
        rows = env_convert.rows_from_proto(request)
        return self._reply(rows, self._start_one, context)

    @rpc_method
    def Step(self, request, context):
        actions = env_convert.actions_from_proto(request)
        return self._reply(actions, self._step_one, context)

    @rpc_method
    def End(self, request, context):
        ids = env_convert.end_ids_from_proto(request)
        return self._reply(ids, lambda episode_id: self._end_one(episode_id, request.reason), context)

    @rpc_method
    def Describe(self, request, context):
        return environment_pb2.DescribeResponse(name=self.env.name, description=self.env.description,
                                                tools=env_convert.tools_to_proto(tuple(self.env.tools)),
                                                contract_revision=CONTRACT_REVISION)

    def expire_idle(self) -> list[str]:
        """Drops the episodes idle for idle_expiry_s (each ended with reason "expired"); their ids."""
        now = self.clock()
        with self._lock:
            idle = [i for i, at in self._touched.items() if now - at > self.idle_expiry_s]
            states = [(i, self._states.pop(i, _MISSING)) for i in idle]
            for i in idle:
                self._touched.pop(i, None)
            self._swept_at = now
        expired = [(i, state) for i, state in states if state is not _MISSING]
        for episode_id, state in expired:
            try:
                self.env.end(state, "expired")
            except Exception as exc:  # noqa: BLE001 - the environment's bug must not stop the sweep
                log.warning("ending an expired episode failed", episode=episode_id,
                            error=f"{type(exc).__name__}: {exc}")
        if expired:
            log.warning(f"expired {len(expired)} episodes idle for more than {self.idle_expiry_s:g}s "
                        "(their End never came)")
        return [i for i, _ in expired]

    def _reply(self, items: list, handle: Callable[[Any], StepResult],
               context) -> environment_pb2.StepResponse:
        """One result per item, in order; items run side by side (they are independent)."""
        if self.clock() - self._swept_at > self.idle_expiry_s / 10:  # a sweep now and then, not per call
            self.expire_idle()
        now = self.clock()
        with self._lock:
            for item in items:
                episode_id = item if isinstance(item, str) else item.episode_id
                if episode_id in self._touched:
                    self._touched[episode_id] = now
        futures = [self._pool.submit(self._guarded, handle, item, context) for item in items]
        results = [f.result() for f in futures]
        if context is not None and context.time_remaining() is not None and context.time_remaining() <= 0:
            raise DeadlinePassed("the call's deadline passed")
        return environment_pb2.StepResponse(results=[env_convert.result_to_proto(r) for r in results])

    def _guarded(self, handle: Callable[[Any], StepResult], item: Any, context) -> StepResult:
        episode_id = item if isinstance(item, str) else item.episode_id
        if context is not None and context.time_remaining() is not None and context.time_remaining() <= 0:
            return StepResult(episode_id=episode_id, ok=False, error=f"episode {episode_id}: deadline passed")
        try:
            return handle(item)
        except Exception as exc:  # noqa: BLE001 - the environment's bug fails its episode, not the server
            with self._lock:
                self._states.pop(episode_id, None)
                self._touched.pop(episode_id, None)
            log.warning("episode failed", episode=episode_id, error=f"{type(exc).__name__}: {exc}")
            return StepResult(episode_id=episode_id, ok=False,
                              error=f"episode {episode_id}: {type(exc).__name__}: {exc}")

    # ---- one episode each -------------------------------------------------------------------------
    def _start_one(self, row: EpisodeRow) -> StepResult:
        with self._lock:
            if row.episode_id in self._states:
                return StepResult(episode_id=row.episode_id, ok=False,
                                  error=f"episode {row.episode_id} is already running")
        state = self.env.start(row)
        with self._lock:
            self._states[row.episode_id] = state
            self._touched[row.episode_id] = self.clock()
        return StepResult(episode_id=row.episode_id, observation=Observation.of(self.env.opening(state)))

    def _step_one(self, action: Action) -> StepResult:
        with self._lock:
            state = self._states.get(action.episode_id, _MISSING)
        if state is _MISSING:
            return StepResult(episode_id=action.episode_id, ok=False,
                              error=f"episode {action.episode_id} is not running (never started, or over)")
        result = self.env.step(state, action)
        if not isinstance(result, StepResult):
            raise TypeError(f"step returned {type(result).__name__}, not a Step")
        if result.reward is not None and not math.isfinite(float(result.reward)):
            raise ValueError(f"step returned the non-finite reward {result.reward}")
        if result.done or not result.ok:
            with self._lock:
                self._states.pop(action.episode_id, None)
                self._touched.pop(action.episode_id, None)
        return StepResult(episode_id=action.episode_id, observation=Observation.of(result.observation),
                          reward=None if result.reward is None else float(result.reward), done=result.done,
                          tool_errors=result.tool_errors, ok=result.ok,
                          error=result.error if result.ok or action.episode_id in result.error
                          else f"episode {action.episode_id}: {result.error}", metrics=result.metrics)

    def _end_one(self, episode_id: str, reason: str) -> StepResult:
        with self._lock:
            state = self._states.pop(episode_id, _MISSING)
            self._touched.pop(episode_id, None)
        if state is _MISSING:
            return StepResult(episode_id=episode_id, ok=False,
                              error=f"episode {episode_id} is not running (never started, or over)")
        reward = self.env.end(state, reason)
        if reward is not None and not math.isfinite(float(reward)):
            raise ValueError(f"end returned the non-finite reward {reward}")
        return StepResult(episode_id=episode_id, reward=None if reward is None else float(reward), done=True)

    def running(self) -> int:
        with self._lock:
            return len(self._states)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.env.close()


_MISSING = object()
