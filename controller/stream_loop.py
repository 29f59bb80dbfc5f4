"""One thread running an asyncio event loop, on which the controller streams Generate from every member
of the rollout fleet (controller/generation.py).

A thread per member did not hold at 256 replicas (issue 44): grpc's sync API polls an open stream ten
times a second, every wake-up a GIL hand-off among hundreds of threads. On one loop a member waiting for
work or for its next group costs nothing until its future or its stream has something. What may block
(a wait for a restarted replica, a fleet removal) runs on a thread of its own (`blocking`) so that the
loop never waits for it.
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

Result = TypeVar("Result")


class StreamLoop:
    def __init__(self, name: str = "generation-streams") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._tasks: set[asyncio.Task] = set()
        self._started = False
        self._lock = threading.Lock()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        """Runs `coroutine` as a task on the loop (started on first use), from any thread."""
        with self._lock:
            if not self._started:
                self._started = True
                self._thread.start()
        try:
            self.loop.call_soon_threadsafe(self._start_task, coroutine)
        except RuntimeError:  # closed: the run stopped (a joiner that went live as it did)
            coroutine.close()

    def _start_task(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        self._track(self.loop.create_task(coroutine))

    def spawn(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        """Runs `coroutine` as a task on the running loop, from a task or a callback on it (a Score
        call, controller/scoring.py); close() cancels it with the others."""
        self._track(asyncio.get_running_loop().create_task(coroutine))

    def _track(self, task: asyncio.Task) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def wake(self, waiters: list) -> None:
        """Settles the futures the waiters' tasks await (their `signal`), in one call into the loop
        from any thread (controller/admission.py); nothing once the loop is closed (the run stopped)."""
        futures = [w.signal for w in waiters if w.signal is not None]
        if futures:
            try:
                self.loop.call_soon_threadsafe(_settle_all, futures)
            except RuntimeError:  # closed: no task waits any more
                pass

    def tasks(self) -> int:
        """Tasks running on the loop now."""
        return len(self._tasks)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def close(self, timeout_s: float = 10.0,
              then: Callable[[], Coroutine[Any, Any, Any]] | None = None) -> None:
        """Cancels the tasks still running (each runs its `finally`), runs `then()` on the loop (closing
        the channels bound to it), waits `timeout_s` at most for both, then stops the loop and its
        thread."""
        with self._lock:
            started, self._started = self._started, True  # a later submit starts nothing
        if self.loop.is_closed():
            return
        if not started:
            self.loop.close()
            return
        try:
            asyncio.run_coroutine_threadsafe(self._cancel_all(then), self.loop).result(timeout_s)
        except Exception:  # noqa: BLE001 - timed out, or the loop died: it is stopped below anyway
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self.loop.close()

    async def _cancel_all(self, then: Callable[[], Coroutine[Any, Any, Any]] | None) -> None:
        tasks = [t for t in self._tasks if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if then is not None:
            await then()


def _settle_all(futures: list[asyncio.Future]) -> None:
    for future in futures:
        settle(future)


def settle(future: asyncio.Future) -> None:
    """Resolves `future` unless it is already (a hand-out and a poll's timer may both come)."""
    if not future.done():
        future.set_result(None)


async def blocking(fn: Callable[..., Result], *args: Any, **kwargs: Any) -> Result:
    """`fn(*args, **kwargs)` on a thread of its own, awaited without blocking the loop. A thread, not a
    pool: a recovery may wait minutes for a restarted replica, and a pool's few workers (2 cores: 6)
    would hold up every other member's recovery behind it."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Result] = loop.create_future()

    def resolve(outcome: Callable[[Any], None], value: Any) -> None:
        if not done.cancelled():
            outcome(value)

    def run() -> None:
        try:
            settled = (done.set_result, fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - raised in the awaiting task
            settled = (done.set_exception, exc)
        try:
            loop.call_soon_threadsafe(resolve, *settled)
        except RuntimeError:  # the loop closed meanwhile (the run stopped): nobody awaits it
            pass

    threading.Thread(target=run, name=f"blocking-{getattr(fn, '__name__', 'call')}", daemon=True).start()
    return await done
