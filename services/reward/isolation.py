"""Python reward functions scored in worker processes, each item with a deadline.

A reward function is user code: it may loop forever on a pathological answer (a regex, a
sympy simplification), or crash its interpreter. Run in the reward service's own threads
either would stall or kill the service. Here each item is scored in a process pool
(spawned, not forked: the service has gRPC threads) and waited for at most
`item_timeout_s`; an item that takes longer is a failed item ("no reward within ..."),
and the pool, whose worker may be stuck in it, is killed and replaced. A worker that
dies takes every item in flight with it: those are scored again one at a time in a fresh
pool, so only the item that kills its worker fails ("the worker scoring it died").
A pool's workers are started, and the function loaded in each, before any item is sent to
it: an item's deadline is the function's time, never a worker's start-up (seconds on a
loaded machine, which failed good items after a pool was replaced).
"""
from __future__ import annotations

import multiprocessing
import os
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import structlog

from rlfleet.types import ScoreItem, ScoreResult
from services.reward.scorer import RewardScorer, ScoringCancelled, check_items

log = structlog.get_logger(__name__)

_worker_scorers: dict[tuple[str, str], RewardScorer] = {}  # per worker process: loaded once


def _start_worker(parent_pid: int, started) -> None:
    """Worker initializer: says which process it is (so a hung worker can be ended: see
    IsolatedScorer._replace_pool), then watches its parent."""
    started.put(os.getpid())
    _exit_with_parent(parent_pid)


def _exit_with_parent(parent_pid: int) -> None:
    """A worker outlives a reward service that was killed (or exited without closing its pool)
    and sits orphaned; it ends itself within a second of its parent."""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _worker_scorer(fn: str, params: dict[str, Any]) -> RewardScorer:
    key = (fn, repr(sorted(params.items())))
    scorer = _worker_scorers.get(key)
    if scorer is None:
        scorer = _worker_scorers[key] = RewardScorer(fn, params)
    return scorer


def _load_in_worker(fn: str, params: dict[str, Any]) -> int:
    _worker_scorer(fn, params)
    return os.getpid()


def _score_in_worker(fn: str, params: dict[str, Any], item: ScoreItem) -> ScoreResult:
    return _worker_scorer(fn, params).score_one(item)


class IsolatedScorer:
    """`fn`: 'auto', a built-in name or 'pkg.module:function' (as RewardScorer), loaded in each worker."""

    def __init__(self, fn: str = "auto", params: dict[str, Any] | None = None, workers: int = 2,
                 item_timeout_s: float = 60.0):
        self.fn, self.params = fn, dict(params or {})
        self.local = RewardScorer(fn, self.params)  # a bad spec fails here, before any worker starts
        self.workers, self.item_timeout_s = workers, item_timeout_s
        self._started_pool: ProcessPoolExecutor | None = None  # the pool whose workers start() has up
        self._pool = self._new_pool()

    def _new_pool(self) -> ProcessPoolExecutor:
        # Each worker tells its pid through `started` as it starts (before any item): the pool's own
        # list of its processes is private, and a worker stuck in an item must be ended by us.
        context = multiprocessing.get_context("spawn")
        self._started = context.SimpleQueue()
        return ProcessPoolExecutor(self.workers, mp_context=context, initializer=_start_worker,
                                   initargs=(os.getpid(), self._started))

    def _pool_pids(self) -> set[int]:
        pids = set()
        while not self._started.empty():
            pids.add(self._started.get())
        return pids

    def start(self, timeout_s: float = 120.0) -> None:
        """Starts every worker and loads the function in it now (with the service), not at the first
        call: one task per worker, each submit spawning one process while none is idle."""
        futures = [self._pool.submit(_load_in_worker, self.fn, self.params) for _ in range(self.workers)]
        for future in futures:
            future.result(timeout=timeout_s)
        self._started_pool = self._pool

    def _replace_pool(self) -> None:
        """A fresh pool; the old one's workers are killed (one may be stuck in an item for good)."""
        old, old_pids = self._pool, self._pool_pids()
        old_queue = self._started
        self._pool = self._new_pool()
        for process in multiprocessing.active_children():  # this process's children, public API
            if process.pid in old_pids:
                process.kill()
        old.shutdown(wait=False, cancel_futures=True)
        old_queue.close()

    def function_for(self, data_source: str):
        return self.local.function_for(data_source)

    def score(self, items: list[ScoreItem], active=None) -> list[ScoreResult]:
        check_items(items)
        if active is not None and not active():
            raise ScoringCancelled("the caller left before scoring started")
        for item in items:  # an unknown data_source is a bad request, as in RewardScorer
            self.local.function_for(item.data_source)
        results: dict[str, ScoreResult] = {}
        crashed = self._score_batch(items, results)
        for item in crashed:  # alone, so that only the item that kills its worker fails
            self._score_batch([item], results, crash_error="the worker process scoring it died")
        return [results[item.id] for item in items]

    def _score_batch(self, items: list[ScoreItem], results: dict[str, ScoreResult],
                     crash_error: str | None = None) -> list[ScoreItem]:
        """Scores `items` into `results`; returns those lost to a worker that died (unless
        `crash_error` says how to fail them)."""
        pending = list(items)
        lost: list[ScoreItem] = []
        while pending:
            if self._started_pool is not self._pool:  # a fresh pool: its start-up is no item's time
                self.start()
            started = time.monotonic()
            futures: list[tuple[ScoreItem, Future]] = [
                (item, self._pool.submit(_score_in_worker, self.fn, self.params, item)) for item in pending]
            pending = []
            for k, (item, future) in enumerate(futures):
                # Items run `workers` at a time, in order: item k starts within k // workers rounds.
                deadline = started + self.item_timeout_s * (k // self.workers + 1)
                try:
                    results[item.id] = future.result(timeout=max(0.0, deadline - time.monotonic()))
                except FutureTimeout:
                    results[item.id] = ScoreResult(item.id, 0.0, ok=False, error=(
                        f"reward function {self.fn}: no reward within {self.item_timeout_s:g}s "
                        "(reward.fn_timeout_s)"))
                    log.warning("reward function timed out; its worker is replaced", item=item.id,
                                timeout_s=self.item_timeout_s)
                    pending = self._rest(futures[k + 1:], results)
                    self._replace_pool()
                    break
                except BrokenProcessPool:
                    if crash_error is not None:
                        results[item.id] = ScoreResult(item.id, 0.0, ok=False,
                                                       error=f"reward function {self.fn}: {crash_error}")
                    else:
                        lost.append(item)
                    log.warning("a reward worker process died; the pool is replaced", item=item.id)
                    lost.extend(it for it, f in futures[k + 1:] if not self._collect(it, f, results))
                    self._replace_pool()
                    break
        return lost

    @staticmethod
    def _collect(item: ScoreItem, future: Future, results: dict[str, ScoreResult]) -> bool:
        if future.done() and future.exception() is None:
            results[item.id] = future.result()
            return True
        return False

    def _rest(self, futures: list[tuple[ScoreItem, Future]],
              results: dict[str, ScoreResult]) -> list[ScoreItem]:
        """After a timeout: the finished items keep their results, the others are scored again."""
        return [item for item, future in futures if not self._collect(item, future, results)]

    def close(self) -> None:
        self._replace_pool()
        self._pool.shutdown(wait=False, cancel_futures=True)
