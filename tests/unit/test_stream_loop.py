"""controller/stream_loop.py: the event loop the members' generation tasks run on. A blocking call made
through `blocking` (a recovery waiting for a restarted replica) leaves the loop free for the other
members; its result and its error reach the awaiting task; closing cancels the tasks still running,
each running its `finally` (the fleet's generation_ended), then runs the closing coroutine, and closes
the loop (a task submitted later does not run)."""
from __future__ import annotations

import asyncio
import threading

import pytest

from controller.stream_loop import StreamLoop, blocking

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

DEADLINE_S = 30.0


def test_a_blocking_call_leaves_the_loop_to_the_others_and_returns_its_result_or_error():
    streams = StreamLoop()
    release = threading.Event()
    outcome: dict[str, object] = {}
    done = threading.Event()

    async def recovering() -> None:
        outcome["waited"] = await blocking(release.wait, DEADLINE_S)
        try:
            await blocking(int, "not a number")
        except ValueError as exc:
            outcome["error"] = str(exc)
        done.set()

    async def streaming() -> None:  # runs while the other task's call blocks its own thread
        outcome["streamed"] = True
        release.set()

    try:
        streams.submit(recovering())
        streams.submit(streaming())
        assert done.wait(DEADLINE_S)
    finally:
        streams.close()
    assert outcome == {"streamed": True, "waited": True, "error": "invalid literal for int() with base 10: "
                                                                 "'not a number'"}


def test_closing_cancels_the_running_tasks_runs_their_finally_then_the_closing_coroutine():
    streams = StreamLoop()
    order: list[str] = []
    started = threading.Event()

    async def member() -> None:
        try:
            started.set()
            await asyncio.sleep(3600)
        finally:
            order.append("finally")

    async def close_channels() -> None:
        order.append("closed")

    streams.submit(member())
    assert started.wait(DEADLINE_S)
    streams.close(then=close_channels)
    assert order == ["finally", "closed"] and not streams.is_alive() and streams.loop.is_closed()
    streams.submit(member())  # a member that goes live as the run stops: nothing runs, nothing raises
    assert order == ["finally", "closed"]
