"""Ctrl-C and SIGTERM for the processes that drive a run (`rlfleet run`, `rlfleet controller`).

Python's default turns Ctrl-C into a KeyboardInterrupt raised wherever the main
thread happens to be. Inside a blocking gRPC call that can leave the call
waiting forever (seen: `rlfleet run` still inside `Train` a minute after
Ctrl-C, the learner idle). So the first signal only sets the run's stop event
and starts `on_first` (stopping the services, which ends any RPC still in
flight) in a thread; the loop then winds down at its next check. A second
signal raises KeyboardInterrupt at once, for a user who does not want to wait.
"""
from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Self

from rlfleet.errors import RlfleetError

HANDLED = (signal.SIGINT, signal.SIGTERM)


class Interrupted(RlfleetError):
    """The run was stopped by a signal; the exit code is 128 + the signal's number, as a shell reports it."""

    def __init__(self, signum: int):
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")


class StopOnSignal:
    """`with StopOnSignal(stop, on_first):` around a run. Leaving the block after a signal raises
    Interrupted, also when the run ended in an RlfleetError: stopping it is why its last RPC failed."""

    def __init__(self, stop: threading.Event, on_first: Callable[[], None] | None = None):
        self.stop = stop
        self.on_first = on_first
        self.received: int | None = None
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.received is not None:
            raise KeyboardInterrupt
        self.received = signum
        self.stop.set()
        if self.on_first is not None:
            threading.Thread(target=self.on_first, name="stop-on-signal", daemon=True).start()

    def __enter__(self) -> Self:
        if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread
            for signum in HANDLED:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        if self.received is not None and (exc_type is None or issubclass(exc_type, RlfleetError)):
            raise Interrupted(self.received) from None
