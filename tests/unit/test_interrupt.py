"""StopOnSignal: the first signal asks the run to stop, the second one forces it."""
from __future__ import annotations

import os
import signal
import threading

import pytest

from rlfleet.interrupt import Interrupted, StopOnSignal

pytestmark = pytest.mark.unit


def test_first_signal_sets_stop_and_runs_on_first_without_raising():
    stop, called = threading.Event(), threading.Event()
    with StopOnSignal(stop, on_first=called.set) as signals:
        os.kill(os.getpid(), signal.SIGTERM)
        assert called.wait(5)
        assert stop.is_set() and signals.received == signal.SIGTERM
        with pytest.raises(Interrupted) as info:
            signals.raise_if_received()
    assert info.value.exit_code == 143 and "SIGTERM" in str(info.value)


def test_second_signal_raises_keyboard_interrupt():
    with StopOnSignal(threading.Event()):
        os.kill(os.getpid(), signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            signal.sigtimedwait([], 0)  # a bytecode boundary for the handler to run at


def test_previous_handlers_come_back_and_nothing_is_raised_without_a_signal():
    before = signal.getsignal(signal.SIGINT)
    with StopOnSignal(threading.Event()) as signals:
        assert signal.getsignal(signal.SIGINT) != before
    assert signal.getsignal(signal.SIGINT) == before
    signals.raise_if_received()
    assert Interrupted(signal.SIGINT).exit_code == 130
