"""StopOnSignal: the first signal asks the run to stop, the second one forces it."""
from __future__ import annotations

import os
import signal
import threading

import pytest

from rlfleet.errors import RlfleetError
from rlfleet.app.interrupt import Interrupted, StopOnSignal

pytestmark = pytest.mark.unit


def test_first_signal_sets_stop_and_runs_on_first_then_leaving_says_interrupted():
    stop, called = threading.Event(), threading.Event()
    with pytest.raises(Interrupted) as info, StopOnSignal(stop, on_first=called.set) as signals:
        os.kill(os.getpid(), signal.SIGTERM)
        assert called.wait(5)  # nothing raised here: the run winds down by itself
        assert stop.is_set() and signals.received == signal.SIGTERM
    assert info.value.exit_code == 143 and "SIGTERM" in str(info.value)


def test_an_rlfleet_error_after_the_signal_becomes_interrupted_other_errors_pass():
    with pytest.raises(Interrupted), StopOnSignal(threading.Event()):
        os.kill(os.getpid(), signal.SIGINT)
        raise RlfleetError("learner: Train failed with UNAVAILABLE")  # the services were being stopped
    with pytest.raises(ZeroDivisionError), StopOnSignal(threading.Event()):
        os.kill(os.getpid(), signal.SIGINT)
        raise ZeroDivisionError  # a bug stays a bug


def test_second_signal_raises_keyboard_interrupt():
    with pytest.raises(KeyboardInterrupt), StopOnSignal(threading.Event()):
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
        signal.sigtimedwait([], 0)  # a bytecode boundary for the handler to run at


def test_previous_handlers_come_back_and_nothing_is_raised_without_a_signal():
    before = signal.getsignal(signal.SIGINT)
    with StopOnSignal(threading.Event()):  # no signal: leaves quietly
        assert signal.getsignal(signal.SIGINT) != before
    assert signal.getsignal(signal.SIGINT) == before
    assert Interrupted(signal.SIGINT).exit_code == 130
